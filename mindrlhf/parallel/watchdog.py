"""A hung rank ends the job instead of blocking every other rank forever.

Collectives have no timeout: a rank stuck in a verifier or a stalled write leaves the others waiting in
their next collective. Each rank runs one watchdog thread; the loop names its phase (`enter`), and every
host collective beats (`parallel/comm.py`). A rank that has not beaten for `timeout` seconds prints its
rank, node, phase and whether it waits inside a collective (then another rank is the one stuck) or not
(then it is), and exits the process; every rank does so within about `timeout`, so the job ends with the
culprit named. A rank waiting inside a collective gives the stuck rank two more polls to speak first: the
first rank to exit ends the job, and a waiter's message only says someone else is stuck. Megatron's
`--distributed-timeout-minutes` and NCCL's watchdog play this part on GPUs.
In-graph collectives (tensor parallelism inside a compiled step) do not beat; their phase does.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Callable, Optional

EXIT_CODE = 4


class Watchdog:
    def __init__(self, timeout: float, rank: int, node: int, exit_fn: Callable[[int], None] = os._exit,
                 out=None, poll: Optional[float] = None):
        self.timeout, self.rank, self.node = float(timeout), rank, node
        self._exit, self._out = exit_fn, out
        self._poll = poll if poll is not None else min(5.0, max(self.timeout / 10, 0.05))
        self.phase, self.in_collective = "set-up", False
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mindrlhf-watchdog", daemon=True)
        self._thread.start()

    def enter(self, phase: str):
        self.phase, self._last = phase, time.monotonic()

    def beat(self, in_collective: bool):
        self.in_collective, self._last = in_collective, time.monotonic()

    def stop(self):
        self._stop.set()

    def _watch(self):
        while not self._stop.wait(self._poll):
            idle = time.monotonic() - self._last
            if idle <= self.timeout + (2 * self._poll if self.in_collective else 0.0):
                continue
            where = ("waiting inside a collective: another rank has not reached it" if self.in_collective else
                     "outside any collective: this rank is the one that stopped")
            message = (f"watchdog: rank {self.rank} (node {self.node}, host {socket.gethostname()}) has spent "
                       f"{idle:.0f} s in phase '{self.phase}' without reaching its next collective, {where}; "
                       f"ending the job (run.watchdog_timeout = {self.timeout:g} s)")
            out = self._out or sys.stderr
            print(message, file=out, flush=True)
            self._exit(EXIT_CODE)
            return


_CURRENT: Optional[Watchdog] = None


def start(timeout: float, rank: int, node: int) -> Optional[Watchdog]:
    """This process's watchdog (none when timeout is 0); replaces an earlier one."""
    global _CURRENT
    stop()
    _CURRENT = Watchdog(timeout, rank, node) if timeout > 0 else None
    return _CURRENT


def stop():
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.stop()
        _CURRENT = None


def enter(phase: str):
    if _CURRENT is not None:
        _CURRENT.enter(phase)


def beat(in_collective: bool):
    if _CURRENT is not None:
        _CURRENT.beat(in_collective)
