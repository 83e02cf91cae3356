"""Rewrite README.md's config reference from the config dataclasses (tests/test_docs.py checks it is current)."""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mindrlhf.configs.grpo_config import config_reference_markdown  # noqa: E402

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def main():
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    block = f"{START}\n{config_reference_markdown()}\n{END}"
    new = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    with open(README, "w", encoding="utf-8") as fh:
        fh.write(new)


if __name__ == "__main__":
    main()
