"""README's config reference is generated from the dataclasses and must be current."""
import os
import re

import pytest

from mindrlhf.configs.grpo_config import config_reference_markdown

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_readme_config_reference_is_current():
    text = open(README, encoding="utf-8").read()
    m = re.search(r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", text, flags=re.S)
    assert m, "README lacks the config reference markers"
    assert m.group(1) == config_reference_markdown(), "run: python scripts/gen_config_reference.py"


@pytest.mark.parametrize("marker,module", [("upstream-table", "mindrlhf.configs.upstream"),
                                           ("hf-config-table", "mindrlhf.configs.hf_config")])
def test_upstream_tables_are_current(marker, module):
    import importlib
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "UPSTREAM.md")
    text = open(path, encoding="utf-8").read()
    m = re.search(f"<!-- {marker}:start -->\\n(.*?)\\n<!-- {marker}:end -->", text, flags=re.S)
    assert m, f"docs/UPSTREAM.md lacks the {marker} markers"
    assert m.group(1) == importlib.import_module(module).table_markdown(), "run: python scripts/gen_config_reference.py"


def test_readme_names_the_ci_test_command():
    text = open(README, encoding="utf-8").read()
    ci = open(os.path.join(os.path.dirname(__file__), "..", ".ci", "run"), encoding="utf-8").read()
    command = 'python -m pytest -q -m "not slow" tests'
    assert command in text and command in ci
