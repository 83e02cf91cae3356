"""Which swap groups each phase of a GRPO step keeps on the device; the rest go to host when their switch
is on (docs/ARCHITECTURE.md, "Memory phases", is this table in prose)."""
from __future__ import annotations

import contextlib
from typing import Dict

from mindrlhf.parallel.swap import SwapGroup

# phase -> groups that must be resident. The KV cache is resident only inside `generating` (filled by the
# first rollout, freed right after each generation), so no phase lists it.
PHASE_RESIDENT = {
    "rollout": ("rollout",),
    "logprob": ("policy",),
    "ref_logprob": ("policy", "ref"),
    "train": ("policy", "optimizer"),
    "sync": ("policy", "rollout"),
    # scoring sits between rollout rounds (dynamic sampling may generate again), and the rollout weights
    # keep no host copy when offloaded: they stay
    "reward_model": ("reward_model", "rollout"),
}


class SwapSchedule:
    def __init__(self, groups: Dict[str, SwapGroup], offload_kv_cache: bool = False):
        self.groups = groups
        # the switch itself: the KV-cache group has no buffers until the engine has run, so its own
        # `enabled` is False at first whatever the switch says
        self.offload_kv_cache = offload_kv_cache

    @contextlib.contextmanager
    def generating(self, engine):
        """Around a rollout or eval generation: the KV cache resident; after it, freed when its switch is
        on. Its buffers exist only once the engine has run, so they are read from it each time."""
        kv = self.groups["kv_cache"]
        kv.reload()
        yield
        kv.params = engine.cache_parameters()
        kv.enabled = self.offload_kv_cache and bool(kv.params)
        kv.offload()

    def enter(self, phase: str):
        resident = PHASE_RESIDENT[phase]
        for name, group in self.groups.items():
            if name != "kv_cache":
                (group.reload if name in resident else group.offload)()

    @contextlib.contextmanager
    def resident(self, *names: str):
        """Bring `names` to the device for a moment (a checkpoint save), then restore their state."""
        was_offloaded = [n for n in names if not self.groups[n].resident]
        for n in names:
            self.groups[n].reload()
        try:
            yield
        finally:
            for n in was_offloaded:
                self.groups[n].offload()

    def reload_all(self):
        for group in self.groups.values():
            group.reload()

    @property
    def seconds(self) -> float:
        return sum(g.seconds for g in self.groups.values())

    @property
    def host_bytes(self) -> int:
        return sum(g.host_bytes() for g in self.groups.values())

    @property
    def any_enabled(self) -> bool:
        return any(g.enabled for g in self.groups.values())
