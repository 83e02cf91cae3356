"""rows/s converting 20,000 GSM8K-like rows: rlhf_data's converter vs a straightforward per-row conversion
(transformers Qwen2Tokenizer one row at a time, a FileWriter write per row), same tokenizer files, same run.
Last line: one JSON object.
"""
import json
import os
import random
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402,F401  (puts the repo on sys.path)
from mindrlhf.data.convert import build_parser, convert  # noqa: E402
from mindrlhf.data.mindrecord_io import SCHEMA  # noqa: E402
from mindrlhf.data.tokenizer import train_byte_level_bpe  # noqa: E402

ROWS = 20000


def gsm8k_like(n):
    r = random.Random(0)
    names = ["Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken"]
    out = []
    for _ in range(n):
        a, b, c = r.randint(2, 90), r.randint(2, 90), r.randint(2, 9)
        q = (f"{r.choice(names)} sold {a} clips in April and {b} in May. Each clip costs ${c}. "
             f"How much money did {r.choice(names)} make in April and May together?")
        ans = (f"In total {a} + {b} = <<{a}+{b}={a + b}>>{a + b} clips were sold.\n"
               f"That is {a + b} * {c} = <<{a + b}*{c}={(a + b) * c}>>{(a + b) * c} dollars.\n#### {(a + b) * c}")
        out.append({"question": q, "answer": ans})
    return out


def reference(rows, vocab, merges, path, max_prompt=128, seq=256):
    from mindspore.mindrecord import FileWriter
    from transformers import Qwen2Tokenizer
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges)
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    writer = FileWriter(path, shard_num=1, overwrite=True)
    writer.add_schema(SCHEMA, "reference")
    for row in rows:
        p = tok(row["question"], add_special_tokens=False)["input_ids"][-max_prompt:]
        a = tok(" " + row["answer"], add_special_tokens=False)["input_ids"]
        full = (p + a)[:seq]
        prompt = np.full(max_prompt, pad, np.int64)
        prompt[:len(p)] = p
        pre = np.full(seq, pad, np.int64)
        pre[:len(full)] = full
        mask = np.zeros(seq, np.int64)
        mask[len(p):len(full)] = 1
        writer.write_raw_data([{"prompt_ids": prompt, "pretrain_ids": pre, "loss_mask": mask,
                                "prompt_length": np.int64(len(p)), "solution": row["answer"].split("####")[1].strip()}])
    writer.commit()


def main():
    import mindspore.mindrecord  # noqa: F401  (import cost outside both timings)
    import transformers  # noqa: F401
    work = tempfile.mkdtemp(prefix="bench_rlhf_data_")
    rows = gsm8k_like(ROWS)
    src = os.path.join(work, "train.jsonl")
    with open(src, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    vocab, merges = train_byte_level_bpe([r["question"] + " " + r["answer"] for r in rows[:2000]], 2000,
                                         os.path.join(work, "tok"))
    t0 = time.perf_counter()
    convert(build_parser().parse_args(["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", src,
                                       "--output_path", os.path.join(work, "ours.mindrecord"), "--no_progress",
                                       "--max_prompt_length", "128", "--seq_length", "256"]))
    ours = ROWS / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    reference(rows, vocab, merges, os.path.join(work, "ref.mindrecord"))
    ref = ROWS / (time.perf_counter() - t0)
    print(f"ours: {ours:.0f} rows/s   per-row reference: {ref:.0f} rows/s")
    print(json.dumps({"bench": "rlhf_data", "ours": round(ours, 1), "reference": round(ref, 1), "unit": "rows/s",
                      "ratio": round(ours / ref, 2)}))


if __name__ == "__main__":
    main()
