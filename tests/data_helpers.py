"""Test data: a small byte-level BPE and GSM8K-style jsonl files made on the spot."""
from __future__ import annotations

import json

from mindrlhf.data.tokenizer import train_byte_level_bpe

TEXT_SAMPLES = [
    "Hello world 123 4567 and 89", "你好，世界！ 这是一个数学题。", "def f(x):\n    return x  +  1\n",
    "emoji 😀🚀 test", "Question: what is 12+7? #### 19", "tabs\tand  spaces   everywhere\n\n\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
]


def arithmetic_rows(n: int, seed: int = 0):
    import random
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = r.randint(0, 50), r.randint(0, 50)
        rows.append({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}.\n#### {a + b}"})
    return rows


def write_jsonl(path: str, rows) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
    return path


def make_tokenizer_files(out_dir: str, vocab_size: int = 400, extra_texts=()):
    texts = list(TEXT_SAMPLES) * 20 + [r["question"] + " " + r["answer"] for r in arithmetic_rows(200)]
    texts += list(extra_texts)
    return train_byte_level_bpe(texts, vocab_size, out_dir)
