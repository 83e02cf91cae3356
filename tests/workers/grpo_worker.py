"""grpo_one_stage.py with the test verifiers registered; runs under msrun or as a single process.

    python tests/workers/grpo_worker.py <grpo_one_stage.py flags>

`MINDRLHF_TEST_FAIL_AT="rank:step"` makes that rank raise inside that step's update (the failure test);
`MINDRLHF_TEST_PAUSE_IN_SAVE="step:marker"` makes rank 0 stop inside that step's checkpoint save, after its
policy shard is written, touch `marker` and wait to be killed (the crash-resume test).
`MINDRLHF_TEST_FAULT="rank:step:phase:action"` (tests/test_faults.py): when that rank enters that phase
(the loop's phase names: rollout, reward, train, weight_sync, save, ...) in that step, `kill` SIGKILLs the
process, `hang` sleeps for an hour, `enospc` makes its next checkpoint file write fail with ENOSPC.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from mindrlhf.cli import grpo_main  # noqa: E402
from mindrlhf.reward.verifiers import register_verifier  # noqa: E402


@register_verifier("digit_fraction_test")
def digit_fraction(completion, solution):
    """Dense: a random model's completions move it, so advantages are not all zero."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


@register_verifier("response_length_test")
def response_length(completion, solution):
    """Varies within every group (ragged responses): advantages are O(1), so losses and gradients are far
    from the float noise that layouts may differ by."""
    return len(completion) / 50.0


@register_verifier("half_constant_length_test")
def half_constant_length(completion, solution):
    """response_length_test for prompts whose solution ends in an even digit, constant (no signal) for the
    others: dynamic sampling drops those groups."""
    return 0.3 if solution[-1:] in "13579" else len(completion) / 50.0


@register_verifier("solution_length_test")
def solution_length(completion, solution):
    """Depends on every byte of the reference solution (a cut solution changes the reward)."""
    return len(solution.encode("utf-8")) / 1000.0 + (0.5 if solution.endswith("7") else 0.0)


@register_verifier("scoring_rank_test")
def scoring_rank(completion, solution):
    """1 on rank 0, 0 elsewhere (as a verifier that times out on one rank only): with weight 0 it changes
    no reward, and its mean tells which ranks scored the samples rank 0 reports."""
    return 1.0 if os.environ.get("RANK_ID", "0") == "0" else 0.0


def _inject_failure():
    spec = os.environ.get("MINDRLHF_TEST_FAIL_AT")
    if not spec:
        return
    rank, step = (int(x) for x in spec.split(":"))
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    original = GRPOTrainer.update

    def update(self, *args):
        if self.rank == rank and self.step + 1 == step:
            raise RuntimeError(f"injected failure on rank {rank} in step {step}")
        return original(self, *args)

    GRPOTrainer.update = update


def _inject_pause():
    spec = os.environ.get("MINDRLHF_TEST_PAUSE_IN_SAVE")
    if not spec:
        return
    step, marker = spec.split(":", 1)
    import time
    from mindrlhf.trainer import checkpointing
    original = checkpointing.save_params

    def save_params(params, path):
        original(params, path)
        if f"step_{int(step):06d}" in path and "rank_0" in path and path.endswith("policy.safetensors"):
            open(marker, "w").close()
            time.sleep(600)

    checkpointing.save_params = save_params


def _inject_fault():
    spec = os.environ.get("MINDRLHF_TEST_FAULT")
    if not spec:
        return
    rank, step, phase, action = spec.split(":")
    import errno
    import signal
    import time
    from mindrlhf.parallel import watchdog
    from mindrlhf.trainer import checkpointing
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    state = {"step": 0}
    original_step, original_enter, original_save = GRPOTrainer.train_one_step, watchdog.enter, \
        checkpointing.save_params

    def train_one_step(self, *args, **kwargs):
        state["step"] = self.step + 1
        return original_step(self, *args, **kwargs)

    def enter(name):
        original_enter(name)
        if name != phase or state["step"] != int(step) or os.environ.get("RANK_ID", "0") != rank:
            return
        print(f"fault: {action} on rank {rank} in step {step}, phase {phase}", flush=True)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "hang":
            time.sleep(3600)
        elif action == "enospc":
            def full(params, path):
                raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
            checkpointing.save_params = full

    GRPOTrainer.train_one_step = train_one_step
    watchdog.enter = enter


if __name__ == "__main__":
    _inject_failure()
    _inject_pause()
    _inject_fault()
    sys.exit(grpo_main(sys.argv[1:]))
