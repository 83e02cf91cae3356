"""The /dev/shm weight sync on one rank: the free-space check (auto falls back, shm refuses, the answer follows
the most constrained rank), stale segments of dead jobs swept, live ones kept, and exclusive creation.

The segment directory is a temporary one and its free space is faked; with one rank the host collectives are
local, and where another rank's answer matters, `comm.all_gather` is replaced by one that adds that rank."""
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mindrlhf.configs.errors import ConfigError
from mindrlhf.parallel import reshard
from mindrlhf.parallel.layouts import Layout, RoleWeights
from mindrlhf.parallel.reshard import WeightSync

MB = 1 << 20
PREFIX = f"mindrlhf_reshard_{os.getuid()}_"


def role(n, value=None):
    """One float32 parameter of n elements on rank 0; without `value` the parameter itself is never read (the
    transport is decided from the layouts alone)."""
    param = None if value is None else Parameter(Tensor(np.full(n, value, np.float32)), name="w")
    return RoleWeights({"w": param}, {"w": Layout((n,), (1, 1), (-1,))}, 0)


@pytest.fixture
def shm(tmp_path, monkeypatch):
    """A private segment directory; `shm.free(mb)` makes statvfs report that much free space in it."""
    monkeypatch.setattr(reshard, "SHM_DIR", str(tmp_path))
    real = os.statvfs

    def free(mb):
        def fake(path):
            return SimpleNamespace(f_bavail=mb * MB // 4096, f_frsize=4096) if path == str(tmp_path) else real(path)
        monkeypatch.setattr(os, "statvfs", fake)

    return SimpleNamespace(dir=tmp_path, free=free)


def other_ranks(monkeypatch, *answers):
    """Each host all-gather also returns the given rows for the other ranks, one tuple of rows per call."""
    calls = iter(answers)

    def all_gather(array, ranks, my_rank):
        return np.array([np.asarray(array, np.float32)] + [np.asarray(r, np.float32) for r in next(calls)])

    monkeypatch.setattr(reshard.comm, "all_gather", all_gather)


def test_auto_falls_back_to_collective_when_dev_shm_is_too_small(shm):
    shm.free(64)                                          # Docker's default --shm-size
    notes = []
    sync = WeightSync(role(20_000_000), role(20_000_000), "auto", log=notes.append)     # 80 MB of float32
    assert sync.transport == "collective"
    assert len(notes) == 1 and "64 MB free" in notes[0] and "collective" in notes[0], notes
    assert any(f"{mb} MB" in notes[0] for mb in range(80, 200)), notes    # names what the segments need
    assert not list(shm.dir.iterdir())                    # nothing was created


def test_explicit_shm_refuses_with_sizes_and_the_fix(shm):
    shm.free(64)
    with pytest.raises(ConfigError) as err:
        WeightSync(role(20_000_000), role(20_000_000), "shm")
    msg = str(err.value)
    assert "64 MB free" in msg and "--shm-size" in msg and "collective" in msg, msg
    assert any(f"{mb} MB" in msg for mb in range(80, 200)), msg
    assert not list(shm.dir.iterdir())


def test_one_rank_short_of_space_moves_every_rank_to_collective(shm, monkeypatch):
    """This rank has room, rank 1 has not: both must pick the same transport, so this one falls back too."""
    shm.free(4096)
    other_ranks(monkeypatch, [(1, 0)])                    # rank 1: 1 MB free
    notes = []
    sync = WeightSync(role(1000), role(1000), "auto", log=notes.append)
    assert sync.transport == "collective" and "1 MB free" in notes[0], notes


def test_shm_sync_with_room_creates_locked_named_segments_and_removes_them(shm):
    import fcntl
    shm.free(4096)
    src, dst = role(1000, 1.5), role(1000, 0.0)
    sync = WeightSync(src, dst, "auto")
    assert sync.transport == "shm"
    sync.sync()
    assert np.array_equal(dst.params["w"].asnumpy(), np.full(1000, 1.5, np.float32))
    names = [p.name for p in shm.dir.iterdir()]
    assert len(names) == 1 and names[0].startswith(PREFIX) and names[0].endswith("_b0_r0"), names
    with open(shm.dir / names[0], "rb") as probe:         # the owner's lock: what tells a sweeper it is alive
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    sync.close()
    assert not list(shm.dir.iterdir())


def _holder(path):
    """A process that creates `path` and holds a lock on it, as a segment's owner does."""
    code = ("import fcntl, sys, time\nf = open(sys.argv[1], 'wb')\nfcntl.flock(f, fcntl.LOCK_SH)\n"
            "print('locked', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_stale_segments_of_dead_jobs_are_removed_live_ones_kept(shm):
    shm.free(4096)
    old = reshard.PROCESS_START - 3600
    killed = shm.dir / f"{PREFIX}j111_b0_r1"              # its job was killed: the lock died with it
    proc = _holder(killed)
    proc.kill()
    proc.wait()
    live = shm.dir / f"{PREFIX}j222_b0_r0"                # another job, still running
    holder = _holder(live)
    fresh = shm.dir / f"{PREFIX}j333_b0_r0"               # created after this process started: maybe being set up
    fresh.write_bytes(b"x")
    someone_else = shm.dir / f"mindrlhf_reshard_{os.getuid() + 1}_j444_b0_r0"
    unrelated = shm.dir / "other_program_segment"
    for path in (killed, live, someone_else, unrelated):
        path.touch()
        os.utime(path, (old, old))
    try:
        sync = WeightSync(role(1000, 1.0), role(1000, 0.0), "shm")
        assert not killed.exists()
        assert live.exists() and fresh.exists() and someone_else.exists() and unrelated.exists()
        sync.close()
    finally:
        holder.kill()
        holder.wait()


def test_an_existing_segment_name_is_refused_not_reused(shm, monkeypatch):
    shm.free(4096)
    monkeypatch.setattr(reshard, "_draw_token", lambda: 4242)
    theirs = shm.dir / f"{PREFIX}j4242_b0_r0"
    theirs.write_bytes(b"someone else's data")
    with pytest.raises(ConfigError, match="already exists"):
        WeightSync(role(1000, 1.0), role(1000, 0.0), "shm")
    assert theirs.read_bytes() == b"someone else's data"


def test_a_peer_failing_to_create_its_segment_fails_every_rank(shm, monkeypatch):
    """Rank 1 could not create its segment: this rank raises too (instead of waiting in the first sync's
    barrier) and leaves nothing behind."""
    shm.free(4096)
    other_ranks(monkeypatch, [(4096, 0)], [(1,)])         # space: fine everywhere; creation: rank 1 failed
    with pytest.raises(ConfigError, match="rank 1"):
        WeightSync(role(1000, 1.0), role(1000, 0.0), "shm")
    assert not list(shm.dir.iterdir())


def test_collective_transport_never_touches_dev_shm(shm):
    stale = shm.dir / f"{PREFIX}j555_b0_r0"
    stale.touch()
    os.utime(stale, (time.time() - 7200,) * 2)
    sync = WeightSync(role(1000, 1.0), role(1000, 0.0), "collective")
    assert sync.transport == "collective" and stale.exists()
