"""GRPO against a learned reward model, with the rule it imitates kept as a metric only, so that reward
hacking (the reward model's score rising while the rule's accuracy does not) shows in the curves.

    PYTHONPATH=. python examples/grpo/reward_model/rm_grpo.py [--workdir rm_output] [--steps 100]

1-5 the demo's data, tokenizer, MindRecords, configs and supervised warm-up (mindrlhf/demo.py)
rm  a tiny Qwen2ForSequenceClassification (the policy's shapes, its own weights), trained in torch (MSE on the
    score) to predict accuracy_reward on (prompt, response) rows: right '#### n' answers against wrong numbers,
    bare numbers, malformed and random responses; saved with save_pretrained plus the policy's tokenizer files;
    its held-out agreement with the rule measured by our SequenceClassifier on the folder (what GRPO loads)
6-8 the demo's strategy files, slicing and msrun GRPO, rewarded by the reward model alone (weight 1):
    accuracy_reward runs with weight 0, a metric only (`accuracy`); the held-out greedy eval uses the rule
9   the demo's summary, and reward_model_curves.png: reward-model score vs rule accuracy per step, and the
    reward model's agreement with the rule on the policy's own samples (rollout log)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from typing import Dict, List, Tuple

import numpy as np
import yaml

from mindrlhf import demo

KINDS = ("right", "near_wrong", "far_wrong", "bare", "malformed", "noise")
KIND_WEIGHTS = (0.4, 0.15, 0.1, 0.15, 0.1, 0.1)      # ~40% of rows right: the rule's two classes near balanced


def response_text(kind: str, n: int, rng: random.Random) -> str:
    """One response of `kind` to a question whose answer is n ('noise' rows are drawn as token ids instead)."""
    wrong = n + rng.choice([-10, -2, -1, 1, 2, 10]) if kind == "near_wrong" else \
        rng.choice([m for m in range(0, 61) if m != n])
    if kind == "right":
        return f"#### {n}"
    if kind in ("near_wrong", "far_wrong"):
        return f"#### {wrong}"
    if kind == "bare":
        return str(rng.choice([n, wrong]))
    return rng.choice([f"### {n}", f"# {n}", "####", f"{n} ####", "#### ####", f"= {n}", f"#### {n}{rng.randint(0, 9)}",
                       f"#### -{n}", f"{n}.\n{n}"])


def rm_rows(prompts: List[List[int]], solutions: List[str], tok, per_prompt: int, seed: int
            ) -> Tuple[List[List[int]], List[List[int]], np.ndarray, List[str]]:
    """(prompt ids, response ids, rule label, kind) rows: each response tokenized as the warm-up rows hold
    answers (' ' + text, then EOS; 15% without EOS, as a response cut at max_tokens), labelled by the rule
    itself (accuracy_reward on the decoded response), so the labels are the rule's whatever the template."""
    from mindrlhf.reward.verifiers import accuracy_reward
    rng = random.Random(seed)
    specials = {tok.pad_token_id, tok.eos_token_id}
    p_out, r_out, labels, kinds = [], [], [], []
    for p_ids, sol in zip(prompts, solutions):
        for _ in range(per_prompt):
            kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
            if kind == "noise":
                ids = [t for t in (rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 6))) if t not in specials]
                ids = ids or tok.encode(" ?")
            else:
                ids = tok.encode(" " + response_text(kind, int(sol), rng))
            if rng.random() < 0.85:
                ids = ids + [tok.eos_token_id]
            p_out.append(list(p_ids))
            r_out.append(ids)
            labels.append(accuracy_reward(tok.decode(ids), sol))
            kinds.append(kind)
    return p_out, r_out, np.asarray(labels, np.float32), kinds


def prompts_of(mindrecord: str) -> Tuple[List[List[int]], List[str]]:
    """The prompt ids (unpadded) and solutions of a converted prompt MindRecord: the rows GRPO samples from."""
    from mindrlhf.data.mindrecord_io import read_mindrecord
    t = read_mindrecord(mindrecord, ["prompt_ids", "prompt_length", "solution"])
    return [row[:n].tolist() for row, n in zip(t["prompt_ids"], t["prompt_length"])], [str(s) for s in t["solution"]]


def hf_classifier_config(model_yaml: str, pad_token_id: int):
    """A Qwen2Config of the policy's shapes (its model YAML), one label: the reward model's architecture."""
    from transformers import Qwen2Config
    from mindrlhf.configs.compat.sources import load_model_yaml
    m = load_model_yaml(model_yaml).model
    return Qwen2Config(hidden_size=m.hidden_size, num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                       num_key_value_heads=m.n_kv_heads or m.num_heads, intermediate_size=m.intermediate_size,
                       vocab_size=m.vocab_size, rms_norm_eps=m.rms_norm_eps, rope_theta=m.theta,
                       max_position_embeddings=m.seq_length, tie_word_embeddings=False, num_labels=1,
                       pad_token_id=pad_token_id, use_sliding_window=False, torch_dtype="float32")


def train_reward_model(out_dir: str, model_yaml: str, vocab: str, merges: str, train_prompts, steps: int,
                       batch: int = 64, lr: float = 1e-3, seed: int = 0, log=print) -> str:
    """Fit the score of a fresh Qwen2ForSequenceClassification to the rule's 0/1 label (MSE, so the reward keeps
    the rule's scale) on right-padded [prompt | response] rows, read at each row's last real token as our
    SequenceClassifier reads it; save it with the policy's tokenizer files (the trainer checks they match)."""
    import torch
    from transformers import Qwen2ForSequenceClassification
    from mindrlhf.data.tokenizer import load_tokenizer
    tok = load_tokenizer(vocab, merges)
    prompts, responses, labels, _ = rm_rows(*train_prompts, tok, per_prompt=4, seed=seed)
    rows = [p + r for p, r in zip(prompts, responses)]
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(hf_classifier_config(model_yaml, tok.pad_token_id))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * (1 - s / steps)))
    rng = np.random.RandomState(seed)
    log(f"reward model: {len(rows)} rows ({labels.mean():.0%} right by the rule), {steps} steps of {batch}")
    model.train()
    for step in range(steps):
        pick = rng.randint(0, len(rows), batch)
        width = max(len(rows[i]) for i in pick)
        ids = torch.full((batch, width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for j, i in enumerate(pick):
            ids[j, :len(rows[i])] = torch.tensor(rows[i])
            mask[j, :len(rows[i])] = 1
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        score = model.score(hidden[torch.arange(batch), mask.sum(1) - 1])[:, 0]
        loss = torch.nn.functional.mse_loss(score, torch.tensor(labels[pick]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % max(1, steps // 10) == 0:
            log(f"  rm step {step + 1}/{steps} mse {loss.item():.4f}")
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(vocab if name == "vocab.json" else merges, os.path.join(out_dir, name))
    return out_dir


def score_with_framework(rm_dir: str, prompts, responses, batch: int = 64) -> np.ndarray:
    """Our SequenceClassifier on the folder (as --reward_model loads it) over rows laid out as GRPO's samples:
    left-padded prompts, right-padded responses."""
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.configs.compat.hf import classifier_config_from_hf
    from mindrlhf.models.reward_model import SequenceClassifier
    cfg, labels = classifier_config_from_hf(rm_dir)
    model = SequenceClassifier(cfg, labels, random_init=False)
    load_weights(model, rm_dir)
    pw, rw = max(map(len, prompts)), max(map(len, responses))
    out = []
    for s in range(0, len(prompts), batch):
        ids, mask = np.zeros((batch, pw + rw), np.int64), np.zeros((batch, pw + rw), np.int64)
        for j, (p, r) in enumerate(zip(prompts[s:s + batch], responses[s:s + batch])):
            ids[j, pw - len(p):pw], mask[j, pw - len(p):pw] = p, 1
            ids[j, pw:pw + len(r)], mask[j, pw:pw + len(r)] = r, 1
        out.append(model.score_rows(ids, mask)[:len(prompts[s:s + batch]), 0])
    return np.concatenate(out)


def rule_agreement(rm_dir: str, vocab: str, merges: str, test_prompts, seed: int = 1) -> Dict[str, float]:
    """The reward model's agreement with the rule (score > 0.5 <=> right) on held-out questions' rows, overall
    and by kind of response, and its mean score on right and on wrong rows."""
    from mindrlhf.data.tokenizer import load_tokenizer
    prompts, responses, labels, kinds = rm_rows(*test_prompts, load_tokenizer(vocab, merges), per_prompt=4,
                                                seed=seed)
    scores = score_with_framework(rm_dir, prompts, responses)
    agree = (scores > 0.5) == (labels > 0.5)
    kinds = np.asarray(kinds)
    out = {"agreement": float(agree.mean()), "rows": len(labels), "score_right": float(scores[labels > 0.5].mean()),
           "score_wrong": float(scores[labels < 0.5].mean())}
    out.update({f"agreement_{k}": float(agree[kinds == k].mean()) for k in KINDS if (kinds == k).any()})
    return out


def use_reward_model(grpo_yaml: str, rm_dir: str, rollout_log: str):
    """The demo's GRPO config, rewarded by the reward model alone; the rule stays as a weight-0 verifier, so
    its accuracy is logged (metric `accuracy`) without entering the reward."""
    with open(grpo_yaml) as fh:
        doc = yaml.safe_load(fh)
    doc["reward"] = {"verifier_function": ["accuracy_reward"], "verifier_weight": [0.0], "reward_model": rm_dir,
                     "reward_model_weight": 1.0}
    doc["run"]["rollout_log_file"] = rollout_log
    with open(grpo_yaml, "w") as fh:
        yaml.safe_dump(doc, fh)


def on_policy_agreement(rollout_log: str) -> Dict[int, dict]:
    """Per step, from the rollout log (reward = the reward model's score here): the share of the policy's samples
    on which the reward model (score > 0.5) and the rule agree, and the most common response."""
    from collections import Counter
    from mindrlhf.data.mindrecord_io import iter_rows
    from mindrlhf.reward.verifiers import accuracy_reward
    per: Dict[int, list] = {}
    for row in iter_rows(rollout_log, ["step", "response", "reward", "solution"]):
        per.setdefault(int(row["step"]), []).append((row["response"], float(row["reward"]), row["solution"]))
    out = {}
    for step, rows in sorted(per.items()):
        rule = np.array([accuracy_reward(r, s) for r, _, s in rows])
        score = np.array([x for _, x, _ in rows])
        out[step] = {"agreement": float(((score > 0.5) == (rule > 0.5)).mean()), "rule": float(rule.mean()),
                     "score": float(score.mean()),
                     "top_response": Counter(r for r, _, _ in rows).most_common(1)[0][0]}
    return out


def plot(rows: List[dict], on_policy: Dict[int, dict], path: str, compare: List[dict] = ()) -> str:
    """Left: the reward (the reward model's score) against the rule's accuracy, on the training samples and on
    held-out questions (greedy), and `compare`'s held-out accuracy (metrics of a run rewarded by the rule
    itself, e.g. the demo's). Right: the reward model's agreement with the rule on the policy's samples."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r for r in rows if "reward_mean" in r]
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    x = [r["step"] for r in steps]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(x, [r["reward_mean"] for r in steps], label="reward-model score (mean reward)")
    a.plot(x, [r["accuracy"] for r in steps], label="rule accuracy, training samples")
    a.plot([e[0] for e in evals], [e[1] for e in evals], marker="o", label="rule accuracy, held-out greedy")
    if compare:
        a.plot(*zip(*[(r["step"], r["eval_accuracy"]) for r in compare if "eval_accuracy" in r]), marker="o",
               linestyle="--", color="grey", label="rule accuracy, held-out greedy: rewarded by the rule")
    a.set_title("reward model vs the rule it imitates")
    b.plot(list(on_policy), [v["agreement"] for v in on_policy.values()], color="C3")
    b.set_title("reward model agrees with the rule (policy's samples)")
    for ax in (a, b):
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    a.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="rm_output", help="everything this writes goes here")
    p.add_argument("--overwrite", action="store_true", help="use --workdir even if it holds other files")
    p.add_argument("--steps", type=int, default=100, help="GRPO steps")
    p.add_argument("--sft_steps", type=int, default=600, help="the policy's supervised warm-up steps")
    p.add_argument("--rm_steps", type=int, default=4000, help="reward-model training steps (batch 64)")
    p.add_argument("--train_rows", type=int, default=3000)
    p.add_argument("--workers", type=int, default=2, help="msrun workers")
    p.add_argument("--seed", type=int, default=1, help="GRPO seed")
    p.add_argument("--compare", default="", help="metrics.jsonl of the same GRPO rewarded by the rule (the demo's "
                   "grpo_ckpt/metrics.jsonl): its held-out accuracy is drawn for comparison")
    args = p.parse_args(argv)
    t0 = time.time()
    from mindrlhf.configs.errors import ConfigError
    from mindrlhf.utils.output_dir import check_output_dir, write_marker
    try:
        work = check_output_dir(args.workdir, "rm_grpo", "--workdir", args.overwrite)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    os.makedirs(work, exist_ok=True)
    write_marker(work, "rm_grpo", ["*"])
    train = demo.stage_data(work, args.train_rows)
    vocab, merges = demo.stage_tokenizer(work, train)
    demo.stage_convert(work, vocab, merges)
    from mindrlhf.data.tokenizer import load_tokenizer
    paths = demo.stage_configs(work, args.workers, load_tokenizer(vocab, merges).vocab_size, argparse.Namespace(
        arch="qwen2", steps=args.steps, eval_steps=0, seed=args.seed, dynamic_sampling=False))
    full = demo.stage_warmup(work, paths, args.sft_steps)

    t_rm = time.time()
    rm_dir = train_reward_model(os.path.join(work, "reward_model"), paths["single"], vocab, merges,
                                prompts_of(os.path.join(work, "train.mindrecord")), args.rm_steps,
                                log=lambda s: print("      " + s, flush=True))
    agreement = rule_agreement(rm_dir, vocab, merges, prompts_of(os.path.join(work, "test.mindrecord")))
    agreement["seconds"] = time.time() - t_rm
    print("      reward model vs the rule on held-out questions: " + json.dumps(agreement), flush=True)
    rollout_log = os.path.join(work, "rollouts.mindrecord")
    use_reward_model(paths["grpo"], rm_dir, rollout_log)

    sliced = demo.stage_strategy_and_slice(work, paths, full)
    ckpt_dir = demo.stage_grpo(work, paths, sliced, full, vocab, merges, args.workers, args.steps)
    summary = demo.stage_report(work, ckpt_dir, paths)
    from mindrlhf.trainer.metrics import read_metrics
    rows = read_metrics(os.path.join(ckpt_dir, "metrics.jsonl"))
    on_policy = on_policy_agreement(rollout_log)
    steps = [r for r in rows if "reward_mean" in r]
    mean = lambda rs, k: float(np.mean([r[k] for r in rs]))      # noqa: E731
    summary.update(
        reward_model=agreement, rule_accuracy_first5=mean(steps[:5], "accuracy"),
        rule_accuracy_last5=mean(steps[-5:], "accuracy"),
        on_policy_agreement_first5=float(np.mean([v["agreement"] for v in list(on_policy.values())[:5]])),
        on_policy_agreement_last5=float(np.mean([v["agreement"] for v in list(on_policy.values())[-5:]])),
        top_response_last_step=list(on_policy.values())[-1]["top_response"],
        curves=plot(rows, on_policy, os.path.join(work, "reward_model_curves.png"),
                    read_metrics(args.compare) if args.compare else ()),
        seconds=time.time() - t0)
    print(f"  rule accuracy, training samples (first 5 -> last 5) {summary['rule_accuracy_first5']:.3f} -> "
          f"{summary['rule_accuracy_last5']:.3f}\n"
          f"  reward model agrees with the rule on the policy's samples {summary['on_policy_agreement_first5']:.3f}"
          f" -> {summary['on_policy_agreement_last5']:.3f}\n  curves {summary['curves']}", flush=True)
    with open(os.path.join(work, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(f"finished in {summary['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
