"""Pipeline parallelism: the 1F1B schedule and the link that carries activations between adjacent stages.

Schedule (`run_1f1b`): Megatron's non-interleaved one-forward-one-backward. Stage s of pp runs
min(pp - 1 - s, m) warm-up forwards, then alternates one forward and one backward, then drains the
remaining backwards, so at most pp - s micro-batches are in flight on stage s (GPipe holds all m). The
bubble is (pp - 1) / (m + pp - 1) of the step. Every transfer is one call of a link's `exchange`, which
moves a forward activation one way and an activation gradient the other in the same call (Megatron's
send_forward_recv_backward / send_backward_recv_forward), so both ends of a link make the same sequence
of calls and no call waits on a later one (tests/test_pipeline.py simulates the schedule for many pp, m).

Links: `AllReduceLink` (CPU; the one verified here) builds each transfer on the collective MindSpore's CPU
backend has: a sum all-reduce over the two ranks of the link, each contributing its outgoing tensor at
its slot and zeros elsewhere. `P2PLink` (Ascend) uses MindSpore's isend/irecv; it is NOT verified here
(no Ascend device), and is chosen only on Ascend.
"""
from __future__ import annotations

from typing import Callable

import mindspore as ms
from mindspore import ops

from mindrlhf.parallel.mesh import Mesh, group_for


class AllReduceLink:
    """Transfers between this rank and its counterpart (same dp/tp index) on stage `peer_stage`, adjacent.

    exchange(shape, send_fwd, send_bwd, want_fwd, want_bwd): the rank on the earlier stage may send a
    forward activation, the later one an activation gradient, each of `shape`; both get (forward, backward)
    as the other sent them (None where nothing was asked for). Both ranks must call it together."""

    def __init__(self, mesh: Mesh, peer_stage: int, dtype=ms.float32):
        self.peer = mesh.rank_at(peer_stage)
        self.earlier = peer_stage > mesh.stage      # this rank sends forward, receives backward
        self.dtype = dtype
        self.reduce = ops.AllReduce(group=group_for(tuple(sorted((mesh.rank, self.peer)))))
        self._zeros = {}
        self.calls = 0

    def zeros(self, shape):
        if shape not in self._zeros:
            self._zeros[shape] = ops.zeros(shape, self.dtype)
        return self._zeros[shape]

    def exchange(self, shape, send_fwd=None, send_bwd=None, want_fwd=False, want_bwd=False):
        shape = tuple(shape)
        fwd = self.zeros(shape) if send_fwd is None else send_fwd
        bwd = self.zeros(shape) if send_bwd is None else send_bwd
        both = self.reduce(ops.stack((fwd, bwd)))
        self.calls += 1
        return (both[0] if want_fwd else None), (both[1] if want_bwd else None)


class P2PLink(AllReduceLink):
    """Ascend: the same exchange over MindSpore's point-to-point isend/irecv (HCCL). NOT verified here: there
    is no Ascend device on the machines this project is tested on."""

    def exchange(self, shape, send_fwd=None, send_bwd=None, want_fwd=False, want_bwd=False):
        from mindspore.mint import distributed as dist
        out = send_fwd if self.earlier else send_bwd
        want = want_bwd if self.earlier else want_fwd
        handles, recv = [], None
        if out is not None:
            handles.append(dist.isend(out, self.peer))
        if want:
            recv = ops.zeros(tuple(shape), self.dtype)
            handles.append(dist.irecv(recv, self.peer))
        for h in handles:
            if h is not None:
                h.wait()
        self.calls += 1
        return (None, recv) if self.earlier else (recv, None)


def make_links(mesh: Mesh, dtype=ms.float32, on_ascend: bool = False):
    """(link to the previous stage or None, link to the next stage or None). Created in stage order on every
    rank (the previous link first), so the two ranks of a link create its group at the same point."""
    cls = P2PLink if on_ascend else AllReduceLink
    prev = cls(mesh, mesh.stage - 1, dtype) if not mesh.is_first_stage else None
    nxt = cls(mesh, mesh.stage + 1, dtype) if not mesh.is_last_stage else None
    return prev, nxt


class StageIO:
    """The six transfers of Megatron's schedule, each one link call (no-ops at the pipeline's ends), for
    activations of `shape`."""

    def __init__(self, prev, nxt, shape):
        self.prev, self.next, self.shape = prev, nxt, tuple(shape)

    def recv_forward(self):
        return None if self.prev is None else self.prev.exchange(self.shape, want_fwd=True)[0]

    def send_forward(self, y):
        if self.next is not None:
            self.next.exchange(self.shape, send_fwd=y)

    def send_forward_recv_backward(self, y):
        return None if self.next is None else self.next.exchange(self.shape, send_fwd=y, want_bwd=True)[1]

    def send_backward_recv_forward(self, dx):
        return None if self.prev is None else self.prev.exchange(self.shape, send_bwd=dx, want_fwd=True)[0]

    def send_backward(self, dx):
        if self.prev is not None:
            self.prev.exchange(self.shape, send_bwd=dx)

    def recv_backward(self):
        return None if self.next is None else self.next.exchange(self.shape, want_bwd=True)[1]


def run_1f1b(stage: int, pp: int, micro_batches: int, io: StageIO, forward: Callable, backward: Callable):
    """One step of 1F1B on `stage`: forward(i, x) -> y runs micro-batch i's forward on input x (None on the
    first stage), backward(i, dy) -> dx its backward given the output gradient (None on the last stage).
    Micro-batches go forward and backward in order 0..m-1."""
    warm = min(pp - stage - 1, micro_batches)
    rest = micro_batches - warm
    for i in range(warm):
        io.send_forward(forward(i, io.recv_forward()))
    x = io.recv_forward() if rest > 0 else None
    for j in range(rest):
        dy = io.send_forward_recv_backward(forward(warm + j, x))
        dx = backward(j, dy)
        if j == rest - 1:
            io.send_backward(dx)
        else:
            x = io.send_backward_recv_forward(dx)
    for j in range(rest, micro_batches):
        io.send_backward(backward(j, io.recv_backward()))


def run_forward_only(micro_batches: int, io: StageIO, forward: Callable):
    """Forward passes only (log-probs): each micro-batch flows through the stages in order."""
    for i in range(micro_batches):
        io.send_forward(forward(i, io.recv_forward()))


def bubble_fraction(pp: int, micro_batches: int) -> float:
    """1F1B's idle share of a step in theory (equal stage times, free transfers)."""
    return (pp - 1) / (micro_batches + pp - 1)

