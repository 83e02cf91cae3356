"""Fingerprints of a job. Before any training, every node must be running the same job: the same code,
config, data and world size. Each rank sends a few fingerprints (one all-gather); the first rank that
differs from rank 0 stops the job on every rank with an error naming its node and what differs. Paths may
differ between nodes (node-local disks, other mount points), so the config is compared without them and
the files by content (model YAMLs) or size (the prompt MindRecord). The compile cache's directory is named
by a fingerprint too (`compile_cache_dir`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zlib
from typing import Dict

import numpy as np

import mindspore as ms

import mindrlhf
from mindrlhf.configs.errors import ConfigError
from mindrlhf.trainer import exchange
from mindrlhf.parallel.mesh import distributed_env
from mindrlhf.parallel.topology import Nodes

PATH_FIELDS = ("sft_path_train", "sft_path_infer", "sft_path_ref", "vocab_path", "merges_file_path",
               "mind_dataset_dir", "eval_dataset", "save_ckpt_dir", "save_data_file", "rollout_log_file",
               "load_sft_checkpoint_train", "load_sft_checkpoint_infer", "load_ref_checkpoint", "log_dir",
               "save_strategy_dir")
_MOD = 1 << 23          # fingerprints travel as float32: exact below 2^24


def _crc(data: bytes) -> int:
    return zlib.crc32(data) % _MOD


def code_fingerprint() -> int:
    """mindrlhf's version and the contents of its Python sources."""
    root = os.path.dirname(os.path.abspath(mindrlhf.__file__))
    crc = zlib.crc32(str(getattr(mindrlhf, "__version__", "")).encode())
    for dirpath, dirnames, files in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            with open(os.path.join(dirpath, name), "rb") as fh:
                crc = zlib.crc32(fh.read(), crc)
    return crc % _MOD


# what of a Hugging Face folder decides the model and its tokens (its weights are checked when loaded)
HF_FOLDER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")


def _file_crc(path: str) -> int:
    """A file's content checksum; for a folder (an HF model folder), that of its HF_FOLDER_FILES."""
    if path and os.path.isdir(path):
        return _crc(b"".join(str(_file_crc(os.path.join(path, name))).encode() + b";" for name in HF_FOLDER_FILES))
    if not (path and os.path.isfile(path)):
        return -1
    with open(path, "rb") as fh:
        return _crc(fh.read())


def _config_json(cfg, with_paths: bool) -> str:
    """Every section of the GRPO config as sorted JSON; without PATH_FIELDS unless `with_paths`."""
    sections = {f.name: dataclasses.asdict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if not with_paths:
        for name in PATH_FIELDS:
            sections["run"].pop(name, None)
    return json.dumps(sections, sort_keys=True)


def fingerprints(cfg) -> Dict[str, int]:
    run = cfg.run
    data = run.mind_dataset_dir
    size = os.path.getsize(data) if data and os.path.isfile(data) else -1
    return {"world size": distributed_env()[1] % _MOD, "mindrlhf code (version and sources)": code_fingerprint(),
            "GRPO config (paths aside)": _crc(_config_json(cfg, with_paths=False).encode()),
            f"sft_path_train ({run.sft_path_train}) contents": _file_crc(run.sft_path_train),
            f"sft_path_infer ({run.sft_path_infer}) contents": _file_crc(run.sft_path_infer),
            f"size of mind_dataset_dir ({data})": size % _MOD if size >= 0 else -1}


def check_nodes_agree(cfg, nodes: Nodes):
    """Collective; raises ConfigError on every rank when any rank's fingerprints differ from rank 0's."""
    _, world = distributed_env()
    if world == 1:
        return
    mine = fingerprints(cfg)
    table = exchange.gather_over_world(np.array(list(mine.values()), np.float32))
    for other in range(world):
        differ = [name for name, a, b in zip(mine, table[0], table[other]) if a != b]
        if differ:
            raise ConfigError(f"node {nodes.node_of_rank[other]} (rank {other}) differs from node 0 (rank 0) in: "
                              f"{', '.join(differ)}; every node must run the same code, config and data "
                              f"(checked before any training)")


def _file_stamp(path: str) -> str:
    """Which file this is, cheaply: its size and modification time (a dataset may be gigabytes)."""
    if not (path and os.path.exists(path)):
        return "-"
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def compile_cache_dir(cfg, resume_step: int) -> str:
    """save_ckpt_dir/compile_cache/<key>: one directory per job. MindSpore's compile cache hands out its
    graphs by the order they were compiled in and checks only the Python sources (measured with MindSpore
    2.10: a cache written by a model with 4 kv heads, read by one with 2, ran the stale graphs and failed in
    an Assign kernel; a graph scaling by 1 / T, cached at T = 0.5 and run at T = 0.25, silently kept 0.5's
    result). So the key holds whatever decides which graphs compile, in which order: MindSpore's version,
    mindrlhf's sources, the whole config (paths included), the model YAMLs and tokenizer by content, the
    datasets by size and modification time, the world size, and the step a resumed run starts from."""
    run = cfg.run
    parts = [ms.__version__, str(code_fingerprint()), str(distributed_env()[1]), str(resume_step),
             _config_json(cfg, with_paths=True)]
    for path in (run.sft_path_train, run.sft_path_infer, run.sft_path_ref, run.vocab_path, run.merges_file_path):
        parts.append(str(_file_crc(path)))
    for path in (run.mind_dataset_dir, run.eval_dataset):
        parts.append(_file_stamp(path))
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return os.path.join(run.save_ckpt_dir, "compile_cache", key)
