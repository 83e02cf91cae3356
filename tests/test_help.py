"""Every command's --help prints its flags and exits 0 (a help text with a bare '%' once made argparse raise)."""
import contextlib
import io
from dataclasses import dataclass

import pytest

from mindrlhf.configs.fields import flag_parser, help_field

COMMANDS = {
    "python -m mindrlhf.sft": lambda: __import__("mindrlhf.sft", fromlist=["main"]).main(["--help"]),
    "python -m mindrlhf.eval": lambda: __import__("mindrlhf.eval", fromlist=["main"]).main(["--help"]),
    "grpo_one_stage.py": lambda: __import__("mindrlhf.cli", fromlist=["grpo_main"]).grpo_main(["--help"]),
    "rlhf_data.py": lambda: __import__("mindrlhf.data.convert", fromlist=["main"]).main(["--help"]),
    "transform_checkpoint.py": lambda: __import__("mindrlhf.checkpoint.convert", fromlist=["main"]).main(["--help"]),
    "python -m mindrlhf.tools.sandbox": lambda: __import__("mindrlhf.tools.sandbox", fromlist=["main"]).main(["--help"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_exits_zero(command):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        COMMANDS[command]()
    assert exit_.value.code in (0, None), out.getvalue()
    assert "usage:" in out.getvalue() and "--" in out.getvalue()


def test_percent_in_a_field_help_is_printed_as_written():
    @dataclass
    class Flags:
        share: float = help_field(0.5, "a line every ~5% of the steps")

    text = flag_parser(Flags, "prog", "d").format_help()
    assert "~5% of the steps" in " ".join(text.split())
