"""grpo_worker.py for multi-turn runs: `MINDRLHF_TEST_FORCED_IDS="i,j,..."` forces every sample's first tokens
to those ids (a tool call; the model's own log-probs of them are reported), so a tiny random model runs
episodes. Runs under msrun or as a single process (tests/test_episodes_layout.py)."""
import os
import sys

import numpy as np

import grpo_worker  # noqa: F401  (the test verifiers; puts the repository on sys.path)
from mindrlhf.cli import grpo_main  # noqa: E402
from mindrlhf.rollout.engine import GenerationEngine  # noqa: E402
from mindrlhf.rollout.sampling import token_logprobs  # noqa: E402


def _force_first_turn():
    forced_ids = np.array([int(x) for x in os.environ["MINDRLHF_TEST_FORCED_IDS"].split(",")], np.int64)
    original = GenerationEngine._draw

    def draw(self, logits, params, seen, suppress_eos, u, seqs, positions):
        tokens, logp = original(self, logits, params, seen, suppress_eos, u, seqs, positions)
        forced = positions < len(forced_ids)
        if forced.any():
            tokens = np.where(forced, forced_ids[np.minimum(positions, len(forced_ids) - 1)], tokens)
            logp = token_logprobs(logits, tokens, params.logprob_temperature)
        return tokens, logp

    GenerationEngine._draw = draw


if __name__ == "__main__":
    _force_first_turn()
    sys.exit(grpo_main(sys.argv[1:]))
