"""verl's command line, run by our GRPO trainer: `python -m mindrlhf.verl_main key=value ... [--our_flag value ...]`
where verl users type `python3 -m verl.trainer.main_ppo key=value ...`.

1. The dotted overrides are translated by configs/compat/verl.py (one table: mapped, inert with the reason,
   or refused naming the key); one start-up line per key group says what each became.
2. data.train_files / data.val_files (verl's RL parquet) are converted as `rlhf_data.py --dataset_type verl`
   would, into <default_local_dir>/verl_data/{train,val}.mindrecord (rank 0 converts; other ranks wait for
   it); their data_source picks the verifier (a source we have no equivalent for is refused here, unless
   --verifier_function names yours).
3. The translation is written to <default_local_dir>/verl_config.yaml (our sectioned config: the same run is
   `grpo_one_stage.py --config <that file>`), and that is what runs, through mindrlhf.cli.grpo_main, with our
   own flags after the overrides winning over it.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List, Tuple

from mindrlhf.configs.errors import CheckpointError, ConfigError

READY = "READY"
STALE_SECONDS = 30.0        # a READY older than this before our start is a previous run's


def split_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    """(verl overrides, our flags): the overrides come first; from the first `--flag` on, the rest is ours."""
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            if arg == "--config" or arg.startswith("--config="):
                raise ConfigError("--config: the verl overrides are this run's config (they are written to "
                                  "<default_local_dir>/verl_config.yaml); give our settings as --field value flags")
            return argv[:i], argv[i:]
    return argv, []


HYDRA_FLAGS = ("--config-path", "--config-name", "--config-dir")


def hydra_flags(argv: List[str]) -> Tuple[Dict[str, str], List[str]]:
    """Hydra's --config-path / --config-name / --config-dir (`--flag value` or `--flag=value`) wherever they
    stand before our own flags, as verl's Megatron scripts put them first: ({flag: value}, the rest)."""
    found: Dict[str, str] = {}
    rest: List[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in HYDRA_FLAGS:
            if "=" in arg:
                found[name] = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                found[name], i = argv[i + 1], i + 1
            else:
                raise ConfigError(f"{arg}: expected a value")
        elif arg.startswith("--"):
            return found, rest + argv[i:]
        else:
            rest.append(arg)
        i += 1
    return found, rest


def _rank() -> int:
    """This process's rank; -1 for msrun's scheduler, which runs the script too (with no RANK_ID) and must only
    read what rank 0 writes."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return -1
    return int(os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")) or 0)


def _convert(files: List[str], out: str, plan, what: str) -> Dict[str, int]:
    """verl rows -> a prompt MindRecord, as rlhf_data.py --dataset_type verl; returns the data sources' counts."""
    from mindrlhf.data.convert import build_parser, convert
    argv = ["--vocab_path", plan.tokenizer, "--file_path", files[0], "--output_path", out, "--dataset_type", "verl",
            "--prompt_template", "chat", "--max_prompt_length", str(plan.max_prompt_length),
            "--seq_length", str(plan.max_prompt_length + plan.max_response_length),
            "--on_long_prompt", plan.on_long_prompt, "--no_progress"]
    if plan.prompt_key != "prompt":
        argv += ["--map_keys", json.dumps({"prompt": plan.prompt_key})]
    args = build_parser().parse_args(argv)
    args.file_path = files
    summary = convert(args)
    print(f"verl data: {what} {', '.join(files)} -> {out}: {summary.rows_written} prompts"
          + (f" ({summary.prompts_skipped} longer than data.max_prompt_length left out)"
             if summary.prompts_skipped else ""), flush=True)
    return dict(summary.data_sources, _rows=summary.rows_written)


def _wait_for(ready: str, started: float):
    while True:
        if os.path.isfile(ready) and os.path.getmtime(ready) >= started - STALE_SECONDS:
            with open(ready, encoding="utf-8") as fh:
                return json.load(fh)
        time.sleep(0.5)


def prepare_data(plan, eval_wanted: bool) -> Dict[str, Any]:
    """Convert the train (and val) files once per job; every rank gets the paths and the data sources."""
    started = time.time()
    folder = os.path.join(plan.out_dir, "verl_data")
    ready = os.path.join(folder, READY)
    if _rank() != 0:
        return _wait_for(ready, started)
    os.makedirs(folder, exist_ok=True)
    info: Dict[str, Any] = {"train": os.path.join(folder, "train.mindrecord")}
    info["train_sources"] = _convert(plan.train_files, info["train"], plan, "data.train_files")
    if plan.val_files and eval_wanted:
        info["val"] = os.path.join(folder, "val.mindrecord")
        info["val_sources"] = _convert(plan.val_files, info["val"], plan, "data.val_files")
    from mindrlhf.utils.atomic import write_text
    write_text(ready, json.dumps(info))
    return info


def _layout_yamls(model: str, world: int, infer_tp: int, out_dir: str) -> Tuple[str, str]:
    """rollout.tensor_model_parallel_size > 1: the HF folder's model in the train layout (every rank data-parallel,
    as verl's FSDP actor) and the rollout layout (replicas of infer_tp ranks), as model YAMLs."""
    from mindrlhf.configs.compat.hf import model_yaml_from_hf, model_yaml_text
    from mindrlhf.configs.model_config import ParallelConfig
    from mindrlhf.utils.atomic import write_text
    paths = []
    for role, par in (("train", ParallelConfig(data_parallel=world, model_parallel=1)),
                      ("infer", ParallelConfig(data_parallel=world // infer_tp, model_parallel=infer_tp))):
        spec = model_yaml_from_hf(model, par)
        path = os.path.join(out_dir, f"verl_{role}_model.yaml")
        if _rank() == 0:
            write_text(path, model_yaml_text(spec.model, spec.parallel, model))
        paths.append(path)
    return paths[0], paths[1]


def build_config_file(overrides: List[str], ours: List[str], hydra: Dict[str, str] = None) -> str:
    """Translate, print what each key became, convert the data, write verl_config.yaml; returns its path.
    `hydra`: Hydra's flags (hydra_flags): --config-name picks verl's backend, the config folders are verl's own."""
    import yaml
    from mindrlhf.configs.compat import verl as upstream_verl
    from mindrlhf.configs.grpo_config import _field_of
    hydra = hydra or {}
    tr = upstream_verl.translate(upstream_verl.parse_overrides(overrides), _field_of,
                                 hydra.get("--config-name", "ppo_trainer"))
    for flag, value in sorted(hydra.items()):
        what = f"the keys of verl's {value.replace('.yaml', '')}.yaml" if flag == "--config-name" else \
            "verl's own config folder (inert: the keys are read from our table of its YAML)"
        print(f"verl {flag} {value}: {what}", flush=True)
    sections, run = tr.sections, tr.sections["run"]
    plan = tr.data
    eval_wanted = run.get("eval_steps", 0) > 0
    info = prepare_data(plan, eval_wanted)
    run["mind_dataset_dir"] = info["train"]
    tr.mapped.append(("data.train_files", f"run.mind_dataset_dir = {info['train']!r}"))
    tr.mapped.append(("data.max_prompt_length", f"prompt width {plan.max_prompt_length} "
                                                f"(on a longer prompt: {plan.on_long_prompt})"))
    if "val" in info:
        run["eval_dataset"] = info["val"]
        run["eval_prompts"] = info["val_sources"]["_rows"]
        tr.mapped.append(("data.val_files", f"run.eval_dataset = {info['val']!r} ({run['eval_prompts']} prompts)"))
    sources = {k: v for k, v in info["train_sources"].items() if k != "_rows"}
    for k, v in info.get("val_sources", {}).items():
        if k != "_rows":
            sources[k] = sources.get(k, 0) + v
    if tr.infer_tp > 1:
        model = run["sft_path_train"]
        run["sft_path_train"], run["sft_path_infer"] = _layout_yamls(model, tr.world, tr.infer_tp, plan.out_dir)
        run["load_sft_checkpoint_train"] = model
        tr.derived.append(f"run.sft_path_train / sft_path_infer: {run['sft_path_train']}, {run['sft_path_infer']} "
                          f"(the folder's model in {tr.world} data-parallel ranks / {tr.world // tr.infer_tp} rollout "
                          f"replicas of {tr.infer_tp})")
    for line in upstream_verl.startup_lines(tr):
        print(line, flush=True)
    for name, rows in sorted(sources.items()):
        print(upstream_verl.data_source_line(name, rows), flush=True)
    if any(flag in ours for flag in ("--verifier_function", "--reward_funcs")):
        print("verl data: scored by your --verifier_function (the data_source lines above say what verl runs)")
    elif sections.get("reward", {}).get("custom_reward_function"):
        print(f"verl data: scored by custom_reward_function {sections['reward']['custom_reward_function']} on every "
              f"row, as verl scores it")
    elif sections.get("reward", {}).get("reward_model"):
        print("verl data: scored by the reward model alone (reward_model.enable), as verl scores it")
    else:
        sections.setdefault("reward", {})["verifier_function"] = \
            upstream_verl.verifiers_for(sources, ", ".join(plan.train_files + plan.val_files))
    for line in tr.derived:
        print(f"verl derived: {line}", flush=True)
    path = os.path.join(plan.out_dir, "verl_config.yaml")
    head = ("# written by mindrlhf.verl_main from verl's overrides (configs/compat/verl.py); the same run:\n"
            "#   python examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py --config <this file>\n"
            + "".join(f"#   {o}\n" for o in overrides))
    if _rank() == 0:
        from mindrlhf.utils.atomic import write_text
        write_text(path, head + yaml.safe_dump(sections, sort_keys=True))
    else:
        _wait_for_config(path, head + yaml.safe_dump(sections, sort_keys=True))
    return path


def _wait_for_config(path: str, text: str):
    while not (os.path.isfile(path) and open(path, encoding="utf-8").read() == text):
        time.sleep(0.5)


USAGE = """usage: python -m mindrlhf.verl_main key=value ... [--our_flag value ...]

verl's command line (the dotted overrides of `python3 -m verl.trainer.main_ppo`), run by mindrlhf's GRPO
trainer. Each override is mapped to our config, reported as inert with the reason, or refused naming the key:
docs/UPSTREAM.md lists every key. data.train_files / data.val_files (verl's RL parquet) are converted to
MindRecord under trainer.default_local_dir, and the translated config is written there as verl_config.yaml.
Our own flags follow the overrides (`python examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py --help` lists
them) and win over them; --config is refused (the overrides are the config). Hydra's --config-name
ppo_megatron_trainer (verl's Megatron backend, as its Megatron scripts give it, with --config-path) reads the
actor's Megatron layout (tensor / pipeline / expert sizes) as our train layout.
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(USAGE, end="", flush=True)
        return 0
    try:
        hydra, argv = hydra_flags(argv)
        overrides, ours = split_argv(argv)
        if not overrides:
            raise ConfigError("no verl overrides given (e.g. algorithm.adv_estimator=grpo data.train_files=... "
                              "actor_rollout_ref.model.path=...); docs/UPSTREAM.md lists every key")
        path = build_config_file(overrides, ours, hydra)
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    print(f"verl: running {path} (grpo_one_stage.py --config {path}{' ' + ' '.join(ours) if ours else ''})",
          flush=True)
    from mindrlhf.cli import grpo_main
    return grpo_main(["--config", path] + ours)


if __name__ == "__main__":
    sys.exit(main())
