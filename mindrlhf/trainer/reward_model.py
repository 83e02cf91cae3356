"""The reward-model role: a frozen HF sequence classifier (models/reward_model.py) whose score of each sample
joins the rule verifiers' weighted total, times reward.reward_model_weight, before advantages.

What it reads: the sample's own token sequence, [prompt ids | response ids] (the policy's chat template
rendered the prompt; the response ends with the template's end-of-turn / EOS token when it finished), so its
tokenizer must be the policy's (refused otherwise, naming both). Re-rendering the conversation with the
reward model's own chat template is a follow-up.

Where it runs: the train layout (TP x DP as the reference model), or its own with reward.reward_model_parallel
(TP ranks, the rest data-parallel: e.g. a reward model larger than the policy split wider, or beside a
pipelined train layout). After a rollout round's samples are gathered, replica d of its layout scores rows d,
d + dp, ...; the scores reach every rank through exchange.rows_of_all_replicas, so every rank joins the same
numbers. Its weights swap to host
outside the "reward_model" phase (swap.offload_reward_model_param; trainer/swap_schedule.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.compat.hf import classifier_config_from_hf, is_hf_folder
from mindrlhf.configs.model_config import ModelConfig, ParallelConfig
from mindrlhf.data.tokenizer import folder_tokenizer_files, load_folder_tokenizer
from mindrlhf.models.reward_model import SequenceClassifier
from mindrlhf.reward.verifiers import Scores
from mindrlhf.parallel.mesh import mesh_for
from mindrlhf.trainer import exchange

FLAG = "reward.reward_model"
METRIC, SHARE = "reward_model", "reward/reward_model_share"


@dataclass(frozen=True)
class RewardModelSpec:
    path: str
    model_cfg: ModelConfig
    weight: float
    batch_size: int                 # rows per forward on one replica of its layout
    mesh: object                    # its layout: the train mesh, or its own (reward.reward_model_parallel)


def resolve_reward_model(reward_cfg, tokenizer, train_mesh, mini_batch: int, log: Callable = print
                         ) -> Optional[RewardModelSpec]:
    """The run's reward model from reward.*, checked against its folder, its layout and the policy's tokenizer;
    None when reward.reward_model is empty (rules only)."""
    path = reward_cfg.reward_model
    if not path:
        return None
    if not is_hf_folder(path):
        raise ConfigError(f"{FLAG}: {path} is not a Hugging Face folder with config.json")
    ignored = []
    try:
        cfg, labels = classifier_config_from_hf(path, ignored)
    except ConfigError as err:
        raise ConfigError(f"{FLAG}: {err}") from None
    if labels != 1:
        raise ConfigError(f"{FLAG}: {path}/config.json has num_labels {labels}; a reward model scores with one "
                          f"label (num_labels 1)")
    tp = reward_cfg.reward_model_parallel
    if tp:
        world = train_mesh.world_size
        if world % tp:
            raise ConfigError(f"reward.reward_model_parallel: {tp} does not divide the {world} rank(s)")
        parallel, where = ParallelConfig(data_parallel=world // tp, model_parallel=tp), "its own layout"
        mesh = mesh_for(parallel, world, train_mesh.rank, "reward model (reward.reward_model_parallel)")
    else:
        if train_mesh.pp > 1:
            raise ConfigError(f"{FLAG}: runs in the train layout, whose pipeline_stage {train_mesh.pp} it does not "
                              f"support; give it its own layout (reward.reward_model_parallel) or use a TP x DP "
                              f"train layout")
        parallel, where, mesh = ParallelConfig(data_parallel=train_mesh.dp, model_parallel=train_mesh.tp), \
            "the train layout", train_mesh
    try:
        parallel.check_model(cfg)
    except ConfigError as err:
        raise ConfigError(f"{FLAG}: {path}: in {where}: {err}") from None
    _check_same_tokenizer(path, tokenizer)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ConfigError(f"{FLAG}: {path} has vocab_size {cfg.vocab_size}, fewer than the tokenizer's "
                          f"{tokenizer.vocab_size} tokens")
    log(f"reward model {path}: {cfg.num_layers} layers, hidden {cfg.hidden_size}, weight "
        f"{reward_cfg.reward_model_weight}, in {where} dp={mesh.dp} tp={mesh.tp}" +
        "".join(f"\n  {path}/config.json {k}: not used ({why})" for k, why in ignored))
    return RewardModelSpec(path, cfg, float(reward_cfg.reward_model_weight),
                           reward_cfg.reward_model_batch_size or mini_batch, mesh)


def _folder_tokenizer(path: str):
    if folder_tokenizer_files(path):
        return load_folder_tokenizer(path)
    raise ConfigError(f"{FLAG}: {path} holds no tokenizer (tokenizer.json, vocab.json + merges.txt or "
                      f"tokenizer.model): the reward model must read the policy's tokens with the policy's "
                      f"tokenizer, which cannot be checked without its own")


def _vocabulary(tok) -> dict:
    """token -> id of a data/tokenizer.py tokenizer (its BPE or sentencepiece backend)."""
    if hasattr(tok, "_sp"):
        return {tok._sp.id_to_piece(i): i for i in range(tok._sp.get_piece_size())}  # pylint: disable=protected-access
    return tok._tok.get_vocab(with_added_tokens=True)  # pylint: disable=protected-access


def _check_same_tokenizer(path: str, policy_tokenizer):
    theirs, ours = _vocabulary(_folder_tokenizer(path)), _vocabulary(policy_tokenizer)
    if theirs != ours:
        diff = sorted(set(theirs.items()) ^ set(ours.items()))[:3]
        raise ConfigError(f"{FLAG}: the tokenizer of {path} ({len(theirs)} tokens) differs from the policy's "
                          f"({getattr(policy_tokenizer, 'source', 'vocab_path')}, {len(ours)} tokens), e.g. "
                          f"{diff}: the reward model reads the policy's token ids, so both must share one "
                          f"vocabulary (re-rendering with another tokenizer is not supported yet)")


def build_reward_model(spec: RewardModelSpec, log: Callable = print) -> SequenceClassifier:
    from mindrlhf.checkpoint.model_io import load_weights
    model = SequenceClassifier(spec.model_cfg, 1, spec.mesh, random_init=False)
    load_weights(model, spec.path)
    log(f"reward model loaded from {spec.path}")
    return model


class RewardModelScorer:
    """Scores a round's gathered samples with the reward model and joins them to the verifiers' Scores."""

    def __init__(self, model: SequenceClassifier, spec: RewardModelSpec, swap):
        self.model, self.spec, self.mesh, self.swap = model, spec, spec.mesh, swap

    def scores(self, samples) -> np.ndarray:
        """(N,) float32 on every rank: each replica of its layout scores rows dp_index, dp_index + dp, ... in chunks
        of batch_size rows (the last one filled with empty rows: one compiled shape)."""
        ids = np.concatenate([samples.prompt_ids, samples.response_ids], 1)
        mask = np.concatenate([samples.prompt_mask, samples.response_mask], 1)
        mine = np.arange(self.mesh.dp_index, len(ids), self.mesh.dp)
        local = np.zeros((len(mine), 1), np.float32)
        b = self.spec.batch_size
        self.swap.enter("reward_model")
        for start in range(0, len(mine), b):
            rows = mine[start:start + b]
            chunk_ids, chunk_mask = np.zeros((b, ids.shape[1]), np.int64), np.zeros((b, ids.shape[1]), np.int64)
            chunk_ids[:len(rows)], chunk_mask[:len(rows)] = ids[rows], mask[rows]
            local[start:start + len(rows)] = self.model.score_rows(chunk_ids, chunk_mask)[:len(rows)]
        self.swap.enter("rollout")          # a dynamic-sampling round may generate next
        return exchange.rows_of_all_replicas(local, mine, len(ids), self.mesh)[:, 0]

    def join(self, samples, verified: Scores) -> Scores:
        """The verifiers' Scores with the reward model's: total + weight x score, its raw score as the part
        `reward_model` (metric reward/reward_model), and its share of the summed absolute reward terms."""
        rm = self.scores(samples).astype(np.float64)
        weighted = self.spec.weight * rm
        rules = np.abs(np.asarray(verified.total, np.float64))
        share = float(np.abs(weighted).sum() / max(np.abs(weighted).sum() + rules.sum(), 1e-12))
        total = (np.asarray(verified.total, np.float64) + weighted).tolist()
        return Scores(total, {**verified.parts, METRIC: rm.tolist()}, {**verified.stats, SHARE: share})
