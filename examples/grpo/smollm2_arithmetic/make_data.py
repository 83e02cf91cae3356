"""Arithmetic word problems in GSM8K jsonl form, for GRPO on a small pretrained chat model.

    python make_data.py OUT_DIR [--train 2000] [--test 200] [--seed 0]

Writes OUT_DIR/train.jsonl and OUT_DIR/test.jsonl ({"question", "answer": "... #### n"}). One-step
additions of two one-digit numbers in a short story; one (a, b) pair in four is kept for the test set only,
so held-out questions never occur in training (README.md says why this task suits SmolLM2-135M).
"""
import argparse
import json
import os
import random

NAMES = ["Tom", "Anna", "Li", "Sara", "Omar", "Mia", "Ben", "Zoe", "Ravi", "Lena"]
ITEMS = ["apples", "books", "coins", "pencils", "stickers", "shells", "cards", "marbles"]
QUESTION = ("{name} has {a} {item} and gets {b} more. How many {item} does {name} have now? "
            "End your answer with '#### <number>'.")


def held_out(a: int, b: int) -> bool:
    return (a + 3 * b) % 4 == 0


def rows(n: int, test: bool, rng: random.Random):
    out = []
    while len(out) < n:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        if held_out(a, b) != test:
            continue
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        out.append({"question": QUESTION.format(name=name, a=a, b=b, item=item),
                    "answer": f"{name} has {a} + {b} = {a + b} {item}.\n#### {a + b}"})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(args.seed)
    for name, n, test in (("train", args.train, False), ("test", args.test, True)):
        with open(os.path.join(args.out_dir, f"{name}.jsonl"), "w", encoding="utf-8") as fh:
            for row in rows(n, test, rng):
                fh.write(json.dumps(row) + "\n")
    print(f"wrote {args.out_dir}/train.jsonl ({args.train} rows), {args.out_dir}/test.jsonl ({args.test} rows)")


if __name__ == "__main__":
    main()
