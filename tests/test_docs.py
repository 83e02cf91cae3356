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


@pytest.mark.parametrize("marker", ["eval-reference", "parallel-reference", "sft-reference"])
def test_generated_references_are_current(marker):
    from mindrlhf.configs.fields import reference_markdown
    from mindrlhf.configs.model_config import ParallelConfig
    from mindrlhf.eval import EvalConfig
    from mindrlhf.sft import SFTConfig
    want = {"eval-reference": lambda: reference_markdown(EvalConfig), "sft-reference": lambda: reference_markdown(SFTConfig),
            "parallel-reference": lambda: reference_markdown(ParallelConfig, "parallel_config.")}[marker]()
    text = open(CONFIG_DOC, encoding="utf-8").read()
    m = re.search(f"<!-- {marker}:start -->\\n(.*?)\\n<!-- {marker}:end -->", text, flags=re.S)
    assert m, f"docs/CONFIG.md lacks the {marker} markers"
    assert m.group(1) == want, "run: python scripts/gen_config_reference.py"


@pytest.mark.parametrize("marker,module", [("upstream-table", "mindrlhf.configs.compat.mindrlhf_grpo"),
                                           ("mindformers-table", "mindrlhf.configs.compat.mindformers"),
                                           ("hf-config-table", "mindrlhf.configs.compat.hf"),
                                           ("mindspeed-table", "mindrlhf.configs.compat.mindspeed"),
                                           ("mindspeed-data-table", "mindrlhf.configs.compat.mindspeed_data"),
                                           ("verl-table", "mindrlhf.configs.compat.verl")])
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


# --- docs name only code that exists -------------------------------------------------------------------------
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
PKG = os.path.join(ROOT, "mindrlhf")
# flags of other programs the docs show (msrun, pip, pytest, git, bash scripts' own options)
from mindrlhf.configs.grpo_config import MOVED_FIELDS  # noqa: E402

# packages of other projects that share a name with one of our modules (configs/compat/verl.py, ...)
FOREIGN_PACKAGES = {"verl", "mindspeed", "mindformers", "hf"}
FOREIGN_FLAGS = {"worker_num", "local_worker_num", "master_addr", "master_port", "join", "log_dir", "node_rank",
                 "cluster_time_out", "quiet", "venv", "editable", "durations", "basetemp", "upgrade", "help",
                 "no-deps", "index-url"}


def _doc_files():
    docs = os.path.join(ROOT, "docs")
    return [README] + [os.path.join(docs, f) for f in sorted(os.listdir(docs)) if f.endswith(".md")]


def _code_spans(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"<!-- (\S+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)   # generated from the code
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def _repo_basenames():
    return {f for _, _, files in os.walk(ROOT) for f in files}


def _py_files():
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                out.setdefault(f[:-3], []).append(os.path.join(dirpath, f))
    return out


def _defines(paths, name):
    pattern = re.compile(rf"(def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]|self\.{re.escape(name)}\s*=|"
                         rf"^{re.escape(name)}\s*=", re.M)
    return any(pattern.search(open(p, encoding="utf-8").read()) for p in paths)


def _class_files(name):
    return [p for paths in _py_files().values() for p in paths
            if re.search(rf"^class\s+{re.escape(name)}\b", open(p, encoding="utf-8").read(), re.M)]


def _config_fields():
    from mindrlhf.configs.grpo_config import GRPOConfig
    import dataclasses
    sections = {}
    for f in dataclasses.fields(GRPOConfig):
        sections[f.name] = {g.name for g in dataclasses.fields(f.type if not isinstance(f.type, str)
                                                               else type(getattr(GRPOConfig(), f.name)))}
    return sections


def _unknown_name(span, modules, sections, all_text):
    token = span.strip().rstrip("()").rstrip(",.:")
    if " " in token or "=" in token or token.startswith(("http", "$", "<")):
        return None
    if token.startswith("--"):                      # a flag: some command of ours parses it
        flag = token[2:].split("=")[0].split(" ")[0]
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", flag) or flag in FOREIGN_FLAGS:
            return None
        return None if (f"--{flag}" in all_text or re.search(rf"\b{flag}\b\s*:", all_text)) else f"flag {token}"
    if re.fullmatch(r"[\w./-]+\.(py|sh|yaml|yml|md|json|png|txt)", token):      # a file
        if any(os.path.exists(os.path.join(base, token)) for base in (ROOT, PKG)) or \
                os.path.basename(token) in _repo_basenames() or os.path.basename(token) in all_text:
            return None
        return f"file {token}"
    if "/" in token:                                # a module path, or `dir/module.name`
        path = token.split("::")[0].split("#")[0].rstrip("/")
        if not re.fullmatch(r"[\w./-]+", path) or path.startswith(("/", "..")) or "*" in path:
            return None
        if not re.match(r"(mindrlhf|tests|scripts|benchmarks|examples|docs|model_configs|configs|models|parallel|"
                        r"data|reward|rollout|trainer|checkpoint|utils|tools)/", path):
            return None
        for base in (ROOT, PKG):
            if os.path.exists(os.path.join(base, path)) or os.path.exists(os.path.join(base, path + ".py")):
                return None
            module, _, name = path.rpartition("/")[2].partition(".")
            file = os.path.join(base, path.rpartition("/")[0], module + ".py")
            if name and os.path.isfile(file):
                return None if _defines([file], name.split(".")[0]) else f"{token} (not in {file})"
        last = path.rpartition("/")[2]            # a metric name (`reward/errors`): its key is in the code
        return None if re.search(rf"[\"'/]{re.escape(last)}[\"']", all_text) else f"path {path}"
    parts = token.split(".")
    if len(parts) < 2 or not all(re.fullmatch(r"[A-Za-z_]\w*", p) for p in parts):
        return None
    head, name = parts[0], parts[1]
    if head in FOREIGN_PACKAGES and len(parts) > 2:  # `verl.tools.x.Y` is verl's, not compat/verl.py's
        return None
    if head in sections and name in sections[head]:  # a config field: section.field
        return None
    if f"{head}.{name}" in MOVED_FIELDS:             # a field's earlier section, which still loads
        return None
    if head in sections and head not in modules:
        return f"config field {token}"
    if head in modules:                              # module.name
        return None if _defines(modules[head], name) else f"{token} (not in {head}.py)"
    if head[:1].isupper():                           # Class.member
        files = _class_files(head)
        if files:
            return None if _defines(files, name) else f"{token} (not in class {head})"
    return None


def test_docs_name_only_code_that_exists():
    """Every module path, `module.name`, `Class.member`, config field and flag that README and docs/ name
    exists in the code (generated tables excepted: they are the code)."""
    modules = _py_files()
    sections = _config_fields()
    all_text = "\n".join(open(p, encoding="utf-8", errors="replace").read()
                         for d in ("mindrlhf", "scripts", "examples", "benchmarks", "tests")
                         for dirpath, _, files in os.walk(os.path.join(ROOT, d))
                         for f in files if f.endswith((".py", ".sh"))
                         for p in [os.path.join(dirpath, f)])
    all_text += open(os.path.join(ROOT, "transform_checkpoint.py"), encoding="utf-8").read()
    all_text += open(os.path.join(ROOT, "convert_weight.py"), encoding="utf-8").read()
    missing = []
    for doc in _doc_files():
        for span in _code_spans(doc):
            why = _unknown_name(span, modules, sections, all_text)
            if why:
                missing.append(f"{os.path.relpath(doc, ROOT)}: {why}")
    assert not missing, "docs name code that does not exist:\n" + "\n".join(sorted(set(missing)))
