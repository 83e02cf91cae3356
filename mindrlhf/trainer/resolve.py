"""A GRPO config resolved against its files: model YAMLs (or HF folders), tokenizer, prompt dataset and
the process group. Every cross-file check runs here, before any model is built or any collective runs,
and the result is frozen: the config the trainer runs is the loaded one plus what the files decide (the
infer YAML's generation fields, total_steps from epochs), never changed after.

Resolution needs meshes, the tokenizer, the dataset and the rewards, so it sits in trainer/ (configs/
cannot import those); configs/ keeps the file formats and their per-field checks.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from mindrlhf.checkpoint.hf_interop import peft_export_refusal
from mindrlhf.configs.compat.keys import describe_ignored
from mindrlhf.configs.coerce import coerce
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.fields import default
from mindrlhf.configs.grpo_config import GRPOConfig, RunConfig
from mindrlhf.configs.grpo_load import describe_fields
from mindrlhf.configs.compat.hf import is_hf_folder
from mindrlhf.configs.lora import LoraSpec, parse_targets
from mindrlhf.configs.model_config import ModelConfig, ModelYaml, ParallelConfig, layer_split
from mindrlhf.configs.compat.sources import load_model_yaml
from mindrlhf.data.dataset import PromptDataset
from mindrlhf.data.tokenizer import load_tokenizer
from mindrlhf.parallel.mesh import Mesh, mesh_for
from mindrlhf.parallel.pipeline import bubble_fraction
from mindrlhf.parallel.swap import on_ascend
from mindrlhf.reward.custom_function import load_custom_reward_function
from mindrlhf.reward.verifiers import RewardFn, extract_answer, load_reward_module
from mindrlhf.rollout.backends import check_backend
from mindrlhf.rollout.sampling import SamplingParams
from mindrlhf.trainer import aux_loss
from mindrlhf.trainer.checkpointing import layout_record
from mindrlhf.trainer.packing import PackingLayout
from mindrlhf.trainer.reward_model import RewardModelSpec, resolve_reward_model
from mindrlhf.trainer.step_geometry import StepGeometry


# How the start-up line names each update engine (ResolvedRun.update_graphs), with what the choice trades: the one
# graph steps faster, the layerwise one starts sooner and holds less (docs/BENCHMARKS.md, bench_real_model.py).
UPDATE_GRAPHS_SAID = {
    "one": "one graph for the model (engine.layerwise_update false: the faster steps; its compile time and memory "
           "grow with depth)",
    "layerwise": "a graph per decoder layer (engine.layerwise_update: first-step compile and memory flat in depth; "
                 "each step slower than one graph's)",
    "host": "driven from the host (micro-batches, pipeline stages or packed rows, a graph each)"}


@dataclass(frozen=True)
class ResolvedRun:
    cfg: GRPOConfig                     # frozen: assigning a field raises
    rank: int
    world: int
    model_cfg: ModelConfig              # the policy's (and reference's) model
    infer_model_cfg: ModelConfig        # the rollout model's (same shapes; the dtype may differ)
    train_mesh: Mesh
    infer_mesh: Mesh
    micro_batches: int                  # per update on one train-DP rank
    geometry: StepGeometry
    tokenizer: object
    pad_id: int
    eos_ids: List[int]
    dataset: PromptDataset
    eval_dataset: Optional[PromptDataset]
    prompt_width: int                   # the dataset's prompt_ids column
    reward_fn: RewardFn
    shared_prompt: Tuple[int, int]      # (group, prompt width), or (0, 0): see models/layer_graphs.SharedPrompt
    lora: Optional[LoraSpec] = None     # the policy's adapters; None: full fine-tuning
    packing: Optional[PackingLayout] = None     # engine.sequence_packing; None: one padded row per sequence
    # the reward-model role: None (reward.reward_model empty: rules only) or the frozen sequence classifier
    # in the train layout. The one place that decides; build.py and the loop ask (trainer/reward_model.py)
    reward_model: Optional[RewardModelSpec] = None
    episodes: Optional[object] = None   # rollout/episodes.EpisodeTools (tools.max_tool_calls > 0); None: one turn

    def sampling(self) -> SamplingParams:
        return SamplingParams(**dataclasses.asdict(self.cfg.sampling), n=self.cfg.rl.num_generations,
                              eos_token_ids=self.eos_ids, seed=self.cfg.run.seed)

    def eval_sampling(self) -> SamplingParams:
        """The in-training eval's sampling: the rollout's, with run.eval_temperature / eval_top_p / eval_top_k
        and eval_n completions per prompt (greedy, one, by default)."""
        run = self.cfg.run
        return dataclasses.replace(self.sampling(), temperature=run.eval_temperature, top_p=run.eval_top_p,
                                   top_k=run.eval_top_k, n=run.eval_n)

    @property
    def logprob_temperature(self) -> float:
        """The T of every training log-prob (rollout/sampling.py's convention)."""
        return self.sampling().logprob_temperature

    @property
    def on_policy(self) -> bool:
        """One update per rollout: the weights that sampled are the ones trained, so the old log-probs are
        the train forward's own (detached) and the separate old-policy pass is skipped."""
        return self.cfg.rl.num_iterations == 1 and self.geometry.minibatches == 1

    @property
    def updates_per_step(self) -> int:
        return self.cfg.rl.num_iterations * self.geometry.minibatches

    @property
    def total_updates(self) -> int:
        return self.cfg.run.total_steps * self.updates_per_step

    def layout_state(self) -> dict:
        """What a checkpoint records of the layout (resume refuses another)."""
        state = layout_record(self.world, self.train_mesh, self.infer_mesh, self.model_cfg)
        if self.lora:
            state["lora"] = self.lora.state()
        return state

    @property
    def reference(self) -> str:
        """Where the reference log-probs come from: "none" (rl.beta 0: no KL term, no reference pass),
        "adapters_off" (LoRA: the policy's own graph with every adapter's B zeroed) or "model" (a frozen copy
        in the train layout). The one place that decides; build.py, the loop and the start-up notes ask."""
        if self.cfg.rl.beta == 0:
            return "none"
        return "adapters_off" if self.lora else "model"

    @property
    def update_graphs(self) -> str:
        """How the policy update runs (trainer/update/): "layerwise" (a graph per decoder layer, layerwise.py),
        "host" (micro-batches or pipeline stages driven from the host, pipelined.py) or "one" (one graph per
        update, one_graph.py)."""
        if self.cfg.engine.layerwise_update:
            return "layerwise"
        return "host" if self.micro_batches > 1 or self.train_mesh.pp > 1 or self.packing else "one"

    @property
    def aux_loss_coef(self) -> float:
        """The load-balancing loss's weight the update applies (trainer/aux_loss.py): the model's
        router_aux_loss_coef; 0 for a dense model."""
        return self.model_cfg.router_aux_loss_coef if self.model_cfg.num_experts else 0.0

    @property
    def routing_inputs(self) -> bool:
        """The update takes routing inputs (LossInputs.routing / router_grad) and a routing pass runs before
        it: router replay on, or the aux loss applied. The one place that decides."""
        return self.cfg.rl.router_replay != "none" or self.aux_loss_coef > 0

    @property
    def logprob_graphs(self) -> str:
        """How the no-grad log-prob passes run: "layerwise" (the update's layer template), "stages" (pipeline
        stages, micro-batches forward through them) or "one" (one graph for the model)."""
        if self.update_graphs == "layerwise":
            return "layerwise"
        return "stages" if self.train_mesh.pp > 1 else "one"

    def describe(self) -> str:
        m, i = self.train_mesh, self.infer_mesh
        train = m.sizes() + (f" pp={m.pp} (1F1B)" if m.pp > 1 else "")
        train += (" sequence parallel" if m.seq_parallel else "") + \
            (f", {self.micro_batches} micro-batches per update" if self.micro_batches > 1 else "")
        infer = i.sizes()
        return (f"GRPO: {self.world} rank(s); train layout {train}; infer layout {infer}; "
                f"{self.cfg.rl.batch_size * i.dp} prompts x {self.cfg.rl.num_generations} samples per step; "
                f"update: {UPDATE_GRAPHS_SAID[self.update_graphs]}"
                + (f"; {self.lora.describe()} (base frozen)" if self.lora else "")
                + (f"; {self.packing.describe()}" if self.packing else ""))


def resolve(loaded: GRPOConfig, rank: int, world: int, log: Callable = print) -> ResolvedRun:
    """The run `loaded` describes, checked against its files; `loaded` itself is left as it was."""
    cfg = copy.deepcopy(loaded)
    run = cfg.run
    if not run.sft_path_train:
        raise ConfigError("sft_path_train: required (model YAML of the policy)")
    hf_layout = ParallelConfig(data_parallel=world)      # an HF folder's layout: every rank data-parallel
    train_yaml = load_model_yaml(run.sft_path_train, hf_layout)
    infer_yaml = load_model_yaml(run.sft_path_infer, hf_layout, "infer") if run.sft_path_infer else train_yaml
    ref_yaml = load_model_yaml(run.sft_path_ref, hf_layout) if run.sft_path_ref else None
    yamls = list({y.path: y for y in (train_yaml, infer_yaml, ref_yaml) if y is not None}.values())
    for y in yamls:
        if is_hf_folder(y.path):
            log(f"{y.path}: Hugging Face folder, layout data_parallel={world} (another layout: --train_model_parallel "
                f"N / --infer_model_parallel N, or a model YAML from python -m mindrlhf.configs.hf_config {y.path} "
                f"--model_parallel N)")
    for other, flag in ((infer_yaml, "sft_path_infer"), (ref_yaml, "sft_path_ref")):
        if other is not None and train_yaml.model.weight_shapes() != other.model.weight_shapes():
            raise ConfigError(f"{flag} {other.path}: model.model_config describes another model than "
                              f"{run.sft_path_train} (shapes must match; dtypes may differ)")
    one_file = infer_yaml is train_yaml
    train_yaml, infer_yaml = (_layout_from_config(cfg, role, y, world, log)
                              for role, y in (("train", train_yaml), ("infer", infer_yaml)))
    _take_generation_fields(cfg, infer_yaml, log)
    if infer_yaml.parallel.use_seq_parallel and not one_file:
        infer_yaml.ignored.append(("parallel_config.use_seq_parallel", "sequence parallelism applies to the "
                                   "train layout; the rollout keeps whole activations"))
    if infer_yaml.parallel.distinct_ep_rows and not one_file:
        infer_yaml.ignored.append(("parallel_config.moe_token_dispatcher_type", "alltoall applies to the train "
                                   "layout; the rollout's EP ranks decode the same prompts (allgather), as their "
                                   "decode steps must run in lockstep"))
    _report_ignored(cfg, yamls, log)
    _check_layouts(cfg, train_yaml, infer_yaml)
    par = train_yaml.parallel
    # micro-batches per update: the pipeline's, each cut into micro_batch_interleave_num parts
    micro_batches = (par.micro_batch_num if par.pipeline_stage > 1 else 1) * par.micro_batch_interleave_num
    train_mesh = mesh_for(par, world, rank, "train (sft_path_train)")
    # the rollout runs prefill/decode on whole sequences: sequence parallelism is a training layout's; and its EP
    # ranks share their prompts (each rank's decode loop ends when its own rows do: all-to-all would leave a peer
    # waiting in an exchange)
    infer_mesh = mesh_for(dataclasses.replace(infer_yaml.parallel, use_seq_parallel=False,
                                              moe_token_dispatcher_type="allgather"), world, rank,
                          "infer (sft_path_infer)")
    for path, what in ((run.load_sft_checkpoint_train, "load_sft_checkpoint_train"),
                       (run.load_sft_checkpoint_infer, "load_sft_checkpoint_infer"),
                       (run.load_ref_checkpoint, "load_ref_checkpoint")):
        if path and not os.path.exists(path):
            raise ConfigError(f"{what}: not found: {path}")
    check_backend(run.rollout_backend)

    model_cfg = train_yaml.model
    tokenizer = load_tokenizer(run.vocab_path, run.merges_file_path)
    pad_id, eos_ids = special_ids(tokenizer, model_cfg)
    if not run.mind_dataset_dir:
        raise ConfigError("mind_dataset_dir: required (prompt MindRecord from rlhf_data.py)")
    dataset = with_solutions(PromptDataset(run.mind_dataset_dir, cfg.rl.batch_size, infer_mesh.dp,
                                           infer_mesh.dp_index, run.seed, pad_id, shuffle=run.shuffle), tokenizer, log)
    prompt_width = dataset.table["prompt_ids"].shape[1]
    _check_lengths(cfg, model_cfg, prompt_width)
    geometry = StepGeometry.from_config(cfg.rl, infer_mesh.dp, train_mesh.row_ways)
    micro_batches = _micro_batches(cfg, geometry, train_mesh, micro_batches, run.sft_path_train, log)
    _steps_from_epochs(cfg, dataset.num_rows, infer_mesh.dp, log)
    eval_dataset = _eval_dataset(cfg, infer_mesh, pad_id, tokenizer, log)
    added = load_reward_module(cfg.reward.reward_module)
    if added:
        log(f"verifiers from {cfg.reward.reward_module}: {', '.join(added)}")
    _custom_reward_function(cfg.reward, dataset, log)
    reward_fn = RewardFn(cfg.reward.verifier_function, cfg.reward.verifier_weight, cfg.reward.verifier_timeout)
    reward_model = resolve_reward_model(cfg.reward, tokenizer, train_mesh, geometry.mini_batch, log)
    shared = _shared_prompt(cfg, train_mesh, geometry, micro_batches, prompt_width, log)
    packing = _packing(cfg, prompt_width)
    episodes = _episodes(cfg, tokenizer, log)
    lora = cfg.lora
    spec = LoraSpec(lora.lora_rank, float(lora.lora_alpha), parse_targets(lora.target_modules),
                    cfg.run.seed) if lora.lora_rank else None
    refusal = peft_export_refusal(model_cfg, spec) if spec and lora.lora_export != "merged" else ""
    if refusal:
        raise ConfigError(f"lora.lora_export: {lora.lora_export}: {refusal}. Set lora.lora_export: merged, or leave "
                          f"gate_proj / up_proj / down_proj out of lora.target_modules")
    log("\n".join(describe_fields(cfg)))
    cfg.freeze()
    resolved = ResolvedRun(cfg, rank, world, model_cfg, infer_yaml.model, train_mesh, infer_mesh, micro_batches,
                           geometry, tokenizer, pad_id, eos_ids, dataset, eval_dataset, prompt_width, reward_fn,
                           shared, spec, packing, reward_model,
                           episodes)
    _check_router_replay(resolved, log)
    _say_aux_loss(resolved, log)
    if resolved.reference == "none" and run.load_ref_checkpoint:
        log(f"note: load_ref_checkpoint {run.load_ref_checkpoint} is not loaded: rl.beta is 0, so there is no "
            f"KL term and no reference model (set beta > 0 to use it)")
    return resolved


def _say_aux_loss(run: ResolvedRun, log):
    """Whether the MoE load-balancing loss is part of the update, said at start-up (trainer/aux_loss.py)."""
    coef, path = run.model_cfg.router_aux_loss_coef, run.cfg.run.sft_path_train
    if not (run.model_cfg.num_experts and coef):
        return
    log(aux_loss.describe(path, coef, "each global mini-batch joins the update"))


def _check_router_replay(run: ResolvedRun, log):
    """rl.router_replay r2 / r3 (trainer/router_replay.py): a MoE policy, and for r3 a rollout that records it;
    said at start-up."""
    mode, path = run.cfg.rl.router_replay, run.cfg.run.sft_path_train
    if mode == "none":
        return
    where = f"rl.router_replay {mode}"
    if not run.model_cfg.num_experts:
        raise ConfigError(f"{where}: {path} is a dense model (num_experts 0): there is no expert routing to replay "
                          f"(set rl.router_replay none)")
    if mode == "r3" and run.cfg.run.rollout_backend != "mindspore":
        raise ConfigError(f"{where}: replays the rollout's routing, which only the mindspore rollout backend records "
                          f"(run.rollout_backend {run.cfg.run.rollout_backend}); r2 replays the policy's own")
    layers = len(run.model_cfg.sparse_layers)
    log(f"router replay {mode}: the policy's passes replay " +
        ("the rollout's expert choices" if mode == "r3" else "its own expert choices from before the step's first "
         "update") + f" ({layers} sparse layers x top-{run.model_cfg.num_experts_per_tok}; a routing pass per step "
        f"reports moe/routing_agreement); the reference model routes itself" +
        ("; with one update per rollout r2 replays what that update would choose anyway" if mode == "r2" and
         run.on_policy else ""))


def _custom_reward_function(reward, dataset: PromptDataset, log):
    """reward.custom_reward_function registered as a verifier (reward/custom_function.py), said with where its
    data_source and extra_info come from; a custom function not in verifier_function would never run: refused."""
    name = load_custom_reward_function(reward.custom_reward_function, reward.custom_reward_kwargs,
                                       reward.verifier_function)
    if name is None:
        return
    rows = ("the prompt file's data_source and extra_info columns" if "data_source" in dataset.table else
            f"data_source '' and extra_info None ({dataset.path} was not converted from verl's parquet)")
    log(f"verifier {name}: {reward.custom_reward_function}'s {name}(data_source, solution_str, ground_truth, "
        f"extra_info{', **' + reward.custom_reward_kwargs if reward.custom_reward_kwargs else ''}) with {rows}")


def _layout_from_config(cfg: GRPOConfig, role: str, yaml_cfg: ModelYaml, world: int, log) -> ModelYaml:
    """`yaml_cfg` with the layout sizes the GRPO config or flags give for `role` (parallel.<role>_*) in place of
    its parallel_config's; data_parallel not given: the ranks the other sizes leave. Each replaced size said."""
    given = cfg.parallel.given(role)
    if not given:
        return yaml_cfg
    par, model = yaml_cfg.parallel, yaml_cfg.model
    sizes = dict(given)
    offset = sizes.pop("offset", None)
    if sizes and "data_parallel" not in sizes:
        tp, pp = sizes.get("model_parallel", par.model_parallel), sizes.get("pipeline_stage", par.pipeline_stage)
        if world % (tp * pp):
            raise ConfigError(f"parallel.{role}_model_parallel x {role}_pipeline_stage = {tp} x {pp} does not divide "
                              f"the {world} rank(s)")
        sizes["data_parallel"] = world // (tp * pp)
    changed = [f"{k} {getattr(par, k)} -> {v}" for k, v in sizes.items() if getattr(par, k) != v]
    if offset is not None:
        pp = sizes.get("pipeline_stage", par.pipeline_stage)
        origin = cfg.origin.get(f"parallel.{role}_offset", "the config")
        stages = layer_split(model.num_layers, pp, list(offset), f"parallel.{role}_offset ({origin})")
        model = dataclasses.replace(model, offset=list(offset))
        changed.append(f"offset {yaml_cfg.model.offset} -> {list(offset)} (layers per stage "
                       f"{[len(s) for s in stages]})")
    if changed:
        origins = sorted({cfg.origin.get(f"parallel.{role}_{k}", "the config") for k in given})
        log(f"{role} layout from parallel.{role}_* ({', '.join(origins)}): {', '.join(changed)} in place of "
            f"{yaml_cfg.path}'s parallel_config")
    new = dataclasses.replace(par, **sizes)
    new.check_model(model, f"parallel ({role})")
    return dataclasses.replace(yaml_cfg, parallel=new, model=model, ignored=list(yaml_cfg.ignored))


def _episodes(cfg: GRPOConfig, tokenizer, log):
    """tools.max_tool_calls > 0: the tools (tool_module's functions, tool_config_path's entries), said at start-up
    with their schemas' names and any sandbox protection that is off, and the chat template that renders their
    results (the model folder's: vocab_path or its directory)."""
    t = cfg.tools
    if not t.enabled:
        return None
    from mindrlhf.data.chat_template import ChatTemplate
    from mindrlhf.rollout.episodes import episode_tools
    from mindrlhf.tools import load_tools, sandbox_status
    notes = []
    tools = load_tools(t.tool_module, t.tool_config_path, notes)
    names = [tool.name for tool in tools]
    folder = cfg.run.vocab_path if os.path.isdir(cfg.run.vocab_path) else os.path.dirname(cfg.run.vocab_path)
    try:
        template = ChatTemplate(folder)
    except ConfigError as err:
        raise ConfigError(f"tools.max_tool_calls: {t.max_tool_calls}: tool results are rendered with the model "
                          f"folder's chat template, as it renders a role 'tool' message: {err}") from None
    episodes = episode_tools(t, tools, tokenizer, template)
    schema_names = [s.get("function", {}).get("name", "?") for s in episodes.runner.schemas()]
    log(f"tools: {len(tools)} ({', '.join(names)}; schemas {', '.join(schema_names)}) from "
        f"{' and '.join(x for x in (t.tool_module, t.tool_config_path) if x)}; parser {t.tool_parser_format}, "
        f"max_tool_calls {t.max_tool_calls}, max_parallel_calls {t.max_parallel_calls}, timeout {t.tool_timeout:g} s, "
        f"responses cut to {t.max_tool_response_length} tokens ({t.tool_response_truncate_side} kept), episodes "
        f"<= {t.max_total_response_length or cfg.sampling.max_tokens} tokens; chat template from {folder}")
    for line in list(notes) + list(sandbox_status(tools)):
        log(f"tools: {line}")
    return episodes


def _take_generation_fields(cfg: GRPOConfig, infer_yaml: ModelYaml, log):
    """The infer YAML's generation fields (max_decode_length, top_k, ...) drive sampling, as in MindRLHF,
    except where the GRPO config or a flag set the field."""
    fields = {f.name: f for f in dataclasses.fields(cfg.sampling)}
    taken = []
    for name, value in infer_yaml.generation.items():
        if f"sampling.{name}" not in cfg.explicit:
            cfg.set_from(f"sampling.{name}", coerce(value, fields[name], f"{infer_yaml.path}: {name}"),
                         f"{infer_yaml.path} (model_config)")
            taken.append(f"{name}={getattr(cfg.sampling, name)}")
    cfg.sampling.validate(where=f"{infer_yaml.path}: sampling from model_config: ")
    cfg.validate()          # the checks that involve sampling fields (e.g. rl.overlong_buffer_len)
    if taken:
        log(f"sampling from {infer_yaml.path}: {', '.join(taken)}")


def _report_ignored(cfg: GRPOConfig, yamls: List[ModelYaml], log):
    """Once at start-up: every accepted MindRLHF/MindFormers key that changes nothing here, and why."""
    by_source = {}
    for source, key, why in cfg.ignored:
        by_source.setdefault(source, []).append((key, why))
    for y in yamls:
        if y.ignored:             # one line per file: a MindSpeed-RL file is the config and the model YAML
            by_source.setdefault(y.path, []).extend(y.ignored)
    for source, items in by_source.items():
        log(describe_ignored(source, items))
    for line in cfg.derived:
        log(line)


def micro_batch_count(rows: int, micro_batches: int, where: str) -> int:
    if rows % micro_batches:
        raise ConfigError(f"{where}: {micro_batches} micro-batches do not divide the {rows} sequences of a "
                          f"mini-batch on one train data-parallel rank (rl.mini_batch_size)")
    return micro_batches


def _check_layouts(cfg: GRPOConfig, train_yaml: ModelYaml, infer_yaml: ModelYaml):
    run = cfg.run
    par = train_yaml.parallel
    if cfg.engine.layerwise_update and (par.pipeline_stage > 1 or par.use_seq_parallel):
        setting = f"pipeline_stage {par.pipeline_stage}" if par.pipeline_stage > 1 else "use_seq_parallel True"
        raise ConfigError(f"engine.layerwise_update: runs the whole model on each train rank's whole sequence, and "
                          f"{train_yaml.path} sets parallel_config.{setting} (turn one of them off)")
    if par.distinct_ep_rows and cfg.engine.sequence_packing:
        raise ConfigError("engine.sequence_packing: the train layout's moe_token_dispatcher_type is alltoall, whose "
                          "EP ranks exchange tokens in every pass and so must run as many forwards of the same "
                          "shapes; packed rows differ in number from rank to rank (use allgather, or "
                          "sequence_packing false)")
    if not run.use_parallel and (train_yaml.parallel.world_size > 1 or infer_yaml.parallel.world_size > 1):
        raise ConfigError(f"use_parallel is False but {run.sft_path_train} asks for "
                          f"{train_yaml.parallel.world_size} ranks: launch with msrun and --use_parallel True")
    if infer_yaml.parallel.pipeline_stage > 1:
        raise ConfigError(f"sft_path_infer {infer_yaml.path}: parallel_config.pipeline_stage="
                          f"{infer_yaml.parallel.pipeline_stage}; the rollout (infer) layout has no pipeline "
                          f"stages (as in MindRLHF): use pipeline_stage 1 and data_parallel/model_parallel")
    if train_yaml.model.param_init_type == "bfloat16" and not on_ascend():
        raise ConfigError(f"sft_path_train {train_yaml.path}: model.model_config.param_init_type bfloat16 cannot "
                          f"be trained on MindSpore's CPU: its Assign kernel, with which AdamW writes the weights "
                          f"in place, has no bfloat16 (2.10). Use float32 (or float16) for the policy; the "
                          f"rollout model (sft_path_infer) may keep bfloat16")


def _check_lengths(cfg: GRPOConfig, model_cfg: ModelConfig, prompt_width: int):
    run, max_tokens = cfg.run, cfg.sampling.max_tokens
    need = prompt_width + max_tokens
    for limit, name in ((model_cfg.seq_length, "seq_length"), (model_cfg.max_position_embedding,
                                                               "max_position_embedding")):
        if need > limit:
            raise ConfigError(f"sampling.max_tokens: prompt length {prompt_width} (from {run.mind_dataset_dir}) + "
                              f"max_tokens {max_tokens} = {need} exceeds model.model_config.{name}={limit}")
    if run.max_model_len and need > run.max_model_len:
        raise ConfigError(f"run.max_model_len: prompt length {prompt_width} + max_tokens {max_tokens} = {need} "
                          f"exceeds max_model_len={run.max_model_len}")


def _micro_batches(cfg: GRPOConfig, geometry: StepGeometry, mesh: Mesh, pipeline: int, yaml_path: str, log) -> int:
    """Micro-batches per update: the model YAML's, or engine.micro_batch_size rows each. These must fill the
    mini-batch, and with pipeline stages come in a multiple of the YAML's micro_batch_num."""
    where = f"{yaml_path}: parallel_config.micro_batch_num x micro_batch_interleave_num"
    count, size, mini = pipeline, cfg.engine.micro_batch_size, geometry.mini_batch
    if size:
        if mini % size:
            raise ConfigError(f"engine.micro_batch_size: {size} does not divide the {mini} sequences of a mini-batch on "
                              f"one train data-parallel rank (rl.mini_batch_size)")
        if mesh.pp == 1 and pipeline > 1:
            raise ConfigError(f"engine.micro_batch_size: set, and {where} = {pipeline}; both cut the mini-batch "
                              f"into micro-batches: set one of them")
        if (mini // size) % pipeline:
            raise ConfigError(f"engine.micro_batch_size: {mini // size} micro-batches of {size} rows are not a multiple "
                              f"of the pipeline's {where} = {pipeline}")
        count, where = mini // size, "engine.micro_batch_size"
    if count > 1:
        micro_batch_count(mini, count, where)
        if 1 < mesh.pp and count < mesh.pp:
            log(f"warning: {where}={count} < pipeline_stage={mesh.pp}: some stages idle most of each update (1F1B "
                f"bubble {bubble_fraction(mesh.pp, count):.0%}); micro_batch_num >= pipeline_stage is recommended")
    return count


def _packing(cfg: GRPOConfig, prompt_width: int) -> Optional[PackingLayout]:
    """Packed rows are as wide as a padded input row (any one sequence fits); a micro-batch holds as many as
    engine.max_packing_token_size allows, by default one (an update's last micro-batch is filled up with empty
    rows: one-row micro-batches waste none, and measured as fast as two, benchmarks/bench_packing.py)."""
    rl, engine = cfg.rl, cfg.engine
    if not engine.sequence_packing:
        if engine.max_packing_token_size:
            raise ConfigError("engine.max_packing_token_size: set, but engine.sequence_packing is false (it sizes packed "
                              "micro-batches only)")
        return None
    if rl.loss_agg != "token-mean":
        raise ConfigError(f"engine.sequence_packing: needs rl.loss_agg token-mean (got {rl.loss_agg!r}: its per-sequence "
                          f"means over packed rows are not implemented)")
    if rl.loss_mode == "gspo":
        raise ConfigError("engine.sequence_packing: rl.loss_mode gspo takes a ratio per sequence; over packed rows that "
                          "is not implemented (use a token-level loss_mode or sequence_packing false)")
    width = prompt_width + cfg.sampling.max_tokens - 1
    budget = engine.max_packing_token_size or width
    if budget < width:
        raise ConfigError(f"engine.max_packing_token_size: {budget} tokens hold no packed row of {width} (prompt width "
                          f"{prompt_width} + sampling.max_tokens {cfg.sampling.max_tokens} - 1: the longest "
                          f"sequence); expected >= {width}")
    return PackingLayout(width, budget // width)


def _steps_from_epochs(cfg: GRPOConfig, rows: int, infer_dp: int, log):
    run, per_step = cfg.run, cfg.rl.batch_size * infer_dp
    if not run.epochs or "run.total_steps" in cfg.explicit:
        return
    per_epoch = rows // per_step
    if per_epoch == 0:
        raise ConfigError(f"run.epochs: {run.mind_dataset_dir} has {rows} prompts, fewer than one step's {per_step}")
    cfg.set_from("run.total_steps", run.epochs * per_epoch, f"run.epochs {run.epochs} x {per_epoch} steps per pass")
    log(f"epochs {run.epochs} x {per_epoch} steps per pass over {run.mind_dataset_dir} = {run.total_steps} steps")


def _eval_dataset(cfg: GRPOConfig, infer_mesh: Mesh, pad_id: int, tokenizer, log) -> Optional[PromptDataset]:
    run = cfg.run
    if run.eval_dataset and not run.eval_steps:
        log(f"run.eval_dataset {run.eval_dataset}: no evaluation, run.eval_steps is 0 (--eval_steps N evaluates "
            f"every N steps and at the start and end)")
    given = [k for k in ("eval_temperature", "eval_top_p", "eval_top_k", "eval_n")
             if getattr(run, k) != default(RunConfig, k)]
    if given and not (run.eval_steps and run.eval_dataset):
        log(f"{', '.join('run.' + k for k in given)}: unused, there is no evaluation (run.eval_dataset and "
            f"eval_steps)")
    elif not run.eval_temperature and {"eval_top_p", "eval_top_k"} & set(given):
        log("run.eval_top_p / eval_top_k: unused by a greedy eval (run.eval_temperature 0)")
    if not (run.eval_steps and run.eval_dataset):
        return None
    data = with_solutions(PromptDataset(run.eval_dataset, 1, 1, 0, run.seed, pad_id, shuffle=False), tokenizer, log)
    n = min(run.eval_prompts, data.num_rows)
    if n < infer_mesh.dp:
        raise ConfigError(f"run.eval_prompts: {n} eval prompt(s) (eval_prompts={run.eval_prompts}, {run.eval_dataset} "
                          f"has {data.num_rows}) cannot give each of the {infer_mesh.dp} infer data-parallel "
                          f"replicas one")
    return data


def special_ids(tokenizer, model_cfg: ModelConfig) -> Tuple[int, List[int]]:
    """(pad id, EOS ids) a rollout of `model_cfg` with `tokenizer` uses: the tokenizer's pad token (else the
    model's), every EOS either names. Refuses a tokenizer with more tokens than the model's vocabulary."""
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(f"vocab_path: the tokenizer has {tokenizer.vocab_size} tokens but "
                          f"model.model_config.vocab_size is {model_cfg.vocab_size}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model_cfg.pad_token_id
    return pad_id, sorted({tokenizer.eos_token_id, *model_cfg.eos_token_ids} - {None})


def with_solutions(dataset: PromptDataset, tokenizer, log) -> PromptDataset:
    """The dataset with its solution column; MindRLHF's three-column files get theirs from pretrain_ids."""
    if not dataset.has_solutions:
        dataset.recover_solutions(tokenizer.decode_batch, extract_answer)
        log(f"{dataset.path}: no solution column (MindRLHF's format); solutions taken from the answer part of "
            f"pretrain_ids")
    return dataset


def _shared_prompt(cfg: GRPOConfig, mesh: Mesh, geometry: StepGeometry, micro_batches: int, prompt_width: int,
                   log) -> Tuple[int, int]:
    """(group, prompt width) when the log-prob and training forwards run each prompt once for its group
    (engine.share_prompt, models/layer_graphs.SharedPrompt), else (0, 0) - with a note when asked for but not possible."""
    g = cfg.rl.num_generations
    if not cfg.engine.share_prompt or g == 1:
        return 0, 0
    mini = geometry.mini_batch
    micro_rows = mini // micro_batches
    if cfg.engine.sequence_packing:
        log("note: engine.share_prompt: with engine.sequence_packing every sequence runs its prompt in its packed row")
        return 0, 0
    obstacles = [(mesh.pp > 1, "pipeline stages"), (mesh.seq_parallel, "sequence parallelism"),
                 (mini % g, f"mini-batches of {mini} rows split groups of {g}"),
                 (micro_rows % g, f"micro-batches of {micro_rows} rows split groups of {g}"),
                 (cfg.sampling.max_tokens < 2, "one-token responses")]
    why = next((reason for present, reason in obstacles if present), "")
    if why:
        log(f"note: engine.share_prompt: every row runs its prompt itself ({why} in the train layout)")
        return 0, 0
    return g, prompt_width
