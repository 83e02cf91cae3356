"""LoRA settings as the model reads them: which layers get adapters, their rank and scale (the mechanics
are models/lora.py; the config section is grpo_config.LoraConfig)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from mindrlhf.configs.errors import ConfigError

# our linear layers (MindFormers' names) -> Hugging Face's, in the order a decoder layer holds them
MODULES = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj", "w1": "gate_proj", "w3": "up_proj",
           "w2": "down_proj"}
ROW_PARALLEL = ("wo", "w2")           # the rest are column-parallel
_ALIASES = {**{m: m for m in MODULES}, **{hf: m for m, hf in MODULES.items()}}


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    targets: Tuple[str, ...]          # our module names (MODULES' keys)
    seed: int = 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def on(self, module: str) -> Optional[Tuple[int, float]]:
        """(rank, scaling) when `module` carries an adapter, else None (what a linear layer is built with)."""
        return (self.rank, self.scaling) if module in self.targets else None

    def describe(self) -> str:
        return f"LoRA r={self.rank} alpha={self.alpha:g} on {','.join(self.targets)}"

    def state(self) -> Dict:
        """What a checkpoint records (resume refuses another adapter shape)."""
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}


def parse_targets(value, where: str = "lora.target_modules") -> Tuple[str, ...]:
    """Target modules as users write them: "all-linear", our names (wq, w1, ...), Hugging Face's (q_proj,
    gate_proj, ...), a list, a comma-separated string, or MindFormers' regex alternation ('.*wq|.*wv')."""
    items = value if isinstance(value, (list, tuple)) else str(value).replace("|", ",").split(",")
    names = [str(v).strip() for v in items if str(v).strip()]
    if names == ["all-linear"]:
        return tuple(MODULES)
    out = set()
    for name in names:
        bare = name.split(".")[-1].lstrip("*")          # '.*wq' -> 'wq', 'self_attn.q_proj' -> 'q_proj'
        if bare not in _ALIASES:
            raise ConfigError(f"{where}: {name!r} is not a linear layer of the decoder; expected all-linear or "
                              f"names from {', '.join(MODULES)} (MindFormers) / {', '.join(MODULES.values())} "
                              f"(Hugging Face)")
        out.add(_ALIASES[bare])
    if not out:
        raise ConfigError(f"{where}: empty; name the layers that get adapters (e.g. all-linear)")
    return tuple(m for m in MODULES if m in out)


def require_no_dropout(dropout: float, where: str = "lora.lora_dropout"):
    if dropout:
        raise ConfigError(f"{where}: {dropout}; only 0 is supported. Dropout on the adapter's input makes the "
                          f"train step's log-probs differ from the rollout's and the old policy's for the same "
                          f"weights (the importance ratio is no longer 1 on-policy); verl and OpenRLHF's RL "
                          f"recipes run LoRA without it")

