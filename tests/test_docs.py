"""The generated docs (config reference, upstream tables) must be current; README names the CI test command."""
import os
import re

import pytest

from mindrlhf.configs.grpo_config import config_reference_markdown

README = os.path.join(os.path.dirname(__file__), "..", "README.md")
CONFIG_DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "CONFIG.md")


def test_config_reference_is_current():
    text = open(CONFIG_DOC, encoding="utf-8").read()
    m = re.search(r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", text, flags=re.S)
    assert m, "docs/CONFIG.md lacks the config reference markers"
    assert m.group(1) == config_reference_markdown(), "run: python scripts/gen_config_reference.py"


@pytest.mark.parametrize("marker,module", [("upstream-table", "mindrlhf.configs.upstream"),
                                           ("hf-config-table", "mindrlhf.configs.hf_config"),
                                           ("mindspeed-table", "mindrlhf.configs.upstream_mindspeed"),
                                           ("verl-table", "mindrlhf.configs.upstream_verl")])
def test_upstream_tables_are_current(marker, module):
    import importlib
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "UPSTREAM.md")
    text = open(path, encoding="utf-8").read()
    m = re.search(f"<!-- {marker}:start -->\\n(.*?)\\n<!-- {marker}:end -->", text, flags=re.S)
    assert m, f"docs/UPSTREAM.md lacks the {marker} markers"
    assert m.group(1) == importlib.import_module(module).table_markdown(), "run: python scripts/gen_config_reference.py"


def test_readme_names_the_ci_test_command():
    """README's test command is what CI runs, and it installs what the suite needs before running it."""
    root = os.path.join(os.path.dirname(__file__), "..")
    text = open(README, encoding="utf-8").read()
    ci = open(os.path.join(root, ".ci", "run"), encoding="utf-8").read()
    script = open(os.path.join(root, "scripts", "test.sh"), encoding="utf-8").read()
    assert "bash scripts/test.sh" in text and "bash scripts/test.sh" in ci
    assert 'pip install --quiet -e ".[test]"' in script and 'python -m pytest -q -m "not slow" tests' in script


def test_readme_is_a_front_door():
    with open(README, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert len(lines) <= 200
    assert not any(re.search(r"\bsessions?\b", line, flags=re.I) for line in lines)
