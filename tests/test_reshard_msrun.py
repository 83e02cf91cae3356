"""Online re-layout under msrun (2 workers in the default run, 4 workers marked slow), both transports."""
import json
import os

import pytest

from msrun_util import run_msrun

pytestmark = pytest.mark.msrun
SCRIPT = os.path.join(os.path.dirname(__file__), "workers", "reshard_worker.py")


def _run(tmp_path, workers):
    out = tmp_path / "out"
    out.mkdir()
    run_msrun(SCRIPT, [out], workers=workers, log_dir=str(tmp_path / "log"))
    return [json.load(open(out / f"rank_{r}.json")) for r in range(workers)]


def _check(results, workers):
    cases = {(r["case"], r["transport"]) for r in results[0]}
    assert len(cases) == len(results[0]) >= 6
    for per_rank in results:
        for r in per_rank:
            assert r["exact"], r                     # bit-identical to offline slicing of the train weights
            assert r["synced_gap"] <= 1e-4, r        # the rollout engine really uses the new weights
            assert r["stale_gap"] > 1e-2, r          # a skipped sync is caught by the same check


def test_reshard_two_workers(tmp_path):
    _check(_run(tmp_path, 2), 2)


@pytest.mark.slow
def test_reshard_four_workers(tmp_path):
    _check(_run(tmp_path, 4), 4)
