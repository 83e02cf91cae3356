"""Multiplication word problems a 135M model cannot do in its head, and tool-use conversations to start from.

    python make_data.py OUT_DIR --model smollm2 [--train 2000] [--test 200] [--sft 256] [--seed 0]

Writes, in OUT_DIR:
  train.jsonl, test.jsonl   GRPO prompts in GSM8K form ({"question", "answer": "... #### n"}): a 3-digit number
                            times a 2-digit one in a short story; one (a, b) pair in five is kept for the test
                            set only, so held-out questions never occur in SFT or GRPO data
  sft.jsonl, sft_eval.jsonl tool-use conversations in the chat form TRL's and verl's SFT data take, on other
                            stories (sums and differences): the assistant calls `code_interpreter` with
                            `print(a + b)`, reads the result in a `tool` turn and answers `#### n` (`tools`
                            holds the interpreter's schema). SFT teaches the tool; GRPO, the products
  model/                    the --model folder (files linked, not copied) with this example's chat template,
                            which renders tools and tool calls (SmolLM2's own template drops both)
"""
import argparse
import json
import os
import random
import shutil

from mindrlhf.tools.registry import CODE_INTERPRETER_SCHEMA

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM_PROMPT = "You are a helpful assistant. Use the code_interpreter tool for arithmetic."
NAMES = ["Tom", "Anna", "Li", "Sara", "Omar", "Mia", "Ben", "Zoe", "Ravi", "Lena"]
ITEMS = ["apples", "books", "coins", "pencils", "stickers", "shells", "cards", "marbles"]
STORIES = [           # (question, answer, operation): the GRPO task, a product
    ("{name} packs {b} boxes with {a} {item} in each box. How many {item} does {name} pack?",
     "{name} packs {p} {item}.", "*"),
    ("A shop sells {a} {item} every day. How many {item} does it sell in {b} days?",
     "It sells {p} {item}.", "*"),
    ("{name} has {b} bags and puts {a} {item} in each bag. How many {item} are in the bags?",
     "There are {p} {item} in the bags.", "*"),
]
SFT_STORIES = [       # the cold start's: sums and differences, so SFT teaches the tool, not the task
    ("{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
     "{name} has {p} {item} now.", "+"),
    ("A shop has {a} {item} and sells {b} of them. How many {item} are left?",
     "There are {p} {item} left.", "-"),
]
ASK = " End your answer with '#### <number>'."


def held_out(a: int, b: int) -> bool:
    return (a + 7 * b) % 5 == 0


def problems(n: int, test: bool, rng: random.Random, stories=STORIES):
    """(code, result, question, answer) for `n` problems; a 3-digit a and a 2-digit b, a test pair or not."""
    while n:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        if held_out(a, b) != test:
            continue
        story, answer, op = rng.choice(stories)
        p = {"*": a * b, "+": a + b, "-": a - b}[op]
        fill = dict(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b, p=p)
        yield f"print({a} {op} {b})", p, story.format(**fill) + ASK, answer.format(**fill)
        n -= 1


def conversation(code, result, question, answer):
    call = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}
    return {"messages": [{"role": "system", "content": SYSTEM_PROMPT},
                         {"role": "user", "content": question},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": "code_interpreter", "content": f"{result}\n"},
                         {"role": "assistant", "content": f"{answer}\n#### {result}"}],
            "tools": [CODE_INTERPRETER_SCHEMA]}


def model_folder(src: str, dst: str):
    """`src`'s files linked into `dst`, with this example's chat template in place of the folder's own."""
    if not os.path.isfile(os.path.join(src, "config.json")):
        raise SystemExit(f"--model {src}: not a Hugging Face model folder (no config.json)")
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name == "chat_template.jinja" or os.path.exists(os.path.join(dst, name)):
            continue
        os.symlink(os.path.abspath(os.path.join(src, name)), os.path.join(dst, name))
    config = os.path.join(dst, "tokenizer_config.json")
    if os.path.isfile(config):         # a template here would win over the .jinja file in some readers
        with open(config, encoding="utf-8") as fh:
            data = json.load(fh)
        if "chat_template" in data:
            os.unlink(config)
            data.pop("chat_template")
            with open(config, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=2)
    shutil.copy(os.path.join(HERE, "chat_template.jinja"), os.path.join(dst, "chat_template.jinja"))


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--model", default="", help="the SmolLM2 folder (scripts/get_smollm2.py); empty: no model/")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--sft", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(args.seed)
    out = lambda name: os.path.join(args.out_dir, name)
    for name, n, test in (("train", args.train, False), ("test", args.test, True)):
        write_jsonl(out(f"{name}.jsonl"), ({"question": q, "answer": f"{ans}\n#### {p}"}
                                          for _, p, q, ans in problems(n, test, rng)))
    write_jsonl(out("sft.jsonl"), (conversation(*x) for x in problems(args.sft, False, rng, SFT_STORIES)))
    write_jsonl(out("sft_eval.jsonl"), (conversation(*x) for x in problems(32, True, rng, SFT_STORIES)))
    if args.model:
        model_folder(args.model, out("model"))
    print(f"wrote {args.out_dir}: train.jsonl ({args.train}), test.jsonl ({args.test}), sft.jsonl ({args.sft}), "
          f"sft_eval.jsonl (32)" + (", model/" if args.model else ""))


if __name__ == "__main__":
    main()
