"""Every command's --help prints its flags and exits 0 (a help text with a bare '%' once made argparse raise), run as
the user types it: the script file or `python -m` module itself, not a function behind it."""
import contextlib
import io
import os
import runpy
import sys
import warnings
from dataclasses import dataclass

import pytest

from mindrlhf.configs.fields import flag_parser, help_field

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TUTORIAL = "examples/grpo/qwen_grpo_tutorial/"
SCRIPTS = ["transform_checkpoint.py", "convert_weight.py", TUTORIAL + "grpo_one_stage.py", TUTORIAL + "main.py",
           TUTORIAL + "rlhf_data.py", TUTORIAL + "eval.py", "examples/grpo/reward_model/rm_grpo.py",
           "examples/grpo/smollm2_arithmetic/make_data.py", "examples/grpo/tool_calculator/make_data.py",
           "scripts/get_smollm2.py"]
MODULES = ["mindrlhf.sft", "mindrlhf.eval", "mindrlhf.demo", "mindrlhf.verl_main", "mindrlhf.checkpoint.convert",
           "mindrlhf.configs.hf_config", "mindrlhf.tools.sandbox"]


def _help(command: str, run) -> str:
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [command, "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # run_module of a module imported before
            run()
    finally:
        sys.argv = argv
    assert exit_.value.code in (0, None), out.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_scripts_help_exits_zero(script, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(os.path.join(REPO, script)))   # as `python script.py` would
    text = _help(script, lambda: runpy.run_path(os.path.join(REPO, script), run_name="__main__"))
    assert "usage:" in text and "--" in text


@pytest.mark.parametrize("module", MODULES)
def test_a_modules_help_exits_zero(module):
    text = _help(module, lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    assert "usage:" in text and "--" in text


def test_percent_in_a_field_help_is_printed_as_written():
    @dataclass
    class Flags:
        share: float = help_field(0.5, "a line every ~5% of the steps")

    text = flag_parser(Flags, "prog", "d").format_help()
    assert "~5% of the steps" in " ".join(text.split())
