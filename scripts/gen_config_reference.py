"""Rewrite docs/CONFIG.md's config, eval, SFT and parallel_config references from their dataclasses, and
docs/UPSTREAM.md's tables from mindrlhf/configs/compat/ (mindrlhf_grpo, mindformers, hf, mindspeed, mindspeed_data,
verl; tests/test_docs.py checks all are current)."""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mindrlhf.configs.grpo_config import config_reference_markdown, field_defaults  # noqa: E402
from mindrlhf.configs.fields import reference_markdown  # noqa: E402
from mindrlhf.configs.compat.hf import table_markdown as hf_table_markdown  # noqa: E402
from mindrlhf.configs.model_config import ParallelConfig  # noqa: E402
from mindrlhf.eval import EvalConfig  # noqa: E402
from mindrlhf.sft import SFTConfig  # noqa: E402
from mindrlhf.configs.compat.mindrlhf_grpo import defaults_markdown, table_markdown  # noqa: E402
from mindrlhf.configs.compat.mindformers import table_markdown as mindformers_table_markdown  # noqa: E402
from mindrlhf.configs.compat.mindspeed import table_markdown as mindspeed_table_markdown  # noqa: E402
from mindrlhf.configs.compat.mindspeed_data import table_markdown as mindspeed_data_table_markdown  # noqa: E402
from mindrlhf.configs.compat.verl import table_markdown as verl_table_markdown  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
BLOCKS = [(os.path.join(ROOT, "docs", "CONFIG.md"), "config-reference", config_reference_markdown),
          (os.path.join(ROOT, "docs", "CONFIG.md"), "eval-reference", lambda: reference_markdown(EvalConfig)),
          (os.path.join(ROOT, "docs", "CONFIG.md"), "sft-reference", lambda: reference_markdown(SFTConfig)),
          (os.path.join(ROOT, "docs", "CONFIG.md"), "parallel-reference",
           lambda: reference_markdown(ParallelConfig, "parallel_config.")),
          (os.path.join(ROOT, "docs", "UPSTREAM.md"), "upstream-table", table_markdown),
          (os.path.join(ROOT, "docs", "UPSTREAM.md"), "mindformers-table", mindformers_table_markdown),
          (os.path.join(ROOT, "docs", "UPSTREAM.md"), "defaults-table", lambda: defaults_markdown(field_defaults())),
          (os.path.join(ROOT, "docs", "UPSTREAM.md"), "hf-config-table", hf_table_markdown),
          (os.path.join(ROOT, "docs", "UPSTREAM.md"), "mindspeed-table", mindspeed_table_markdown),
          (os.path.join(ROOT, "docs", "UPSTREAM.md"), "mindspeed-data-table", mindspeed_data_table_markdown),
          (os.path.join(ROOT, "docs", "UPSTREAM.md"), "verl-table", verl_table_markdown)]


def rewrite(path: str, marker: str, content: str):
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    block = f"{start}\n{content}\n{end}"
    new = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(new)


def main():
    for path, marker, make in BLOCKS:
        rewrite(path, marker, make())


if __name__ == "__main__":
    main()
