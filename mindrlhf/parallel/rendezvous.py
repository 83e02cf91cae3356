"""msrun's start-up, made to fail fast when the scheduler's port is taken.

msrun starts a scheduler process and the workers, all running this program. When --master_port is in use,
MindSpore's scheduler fails at once, but the workers keep trying to register with whatever holds the port
until msrun's cluster timeout (600 s). Here the scheduler tries the port before MindSpore does; when it is
taken, it leaves a note that the workers of the same launch (children of the same msrun process) watch for
while they wait in init(), and every process ends with an error naming the port within a second or two.
Workers on other nodes cannot see the note: they wait for msrun's timeout, as before.
"""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import tempfile

from mindrlhf.configs.errors import ConfigError

EXIT_CODE = 2


def _scheduler() -> tuple:
    return os.environ.get("MS_SCHED_HOST", "127.0.0.1"), int(os.environ.get("MS_SCHED_PORT", "0") or 0)


def note_path(port: int, launcher_pid: int = 0) -> str:
    """The note of a launch, keyed by its msrun process (default: our parent) and the port; a program that
    started msrun itself asks with msrun's pid to tell a taken port from other failures."""
    return os.path.join(tempfile.gettempdir(), f"mindrlhf_msrun_{launcher_pid or os.getppid()}_{port}.port_in_use")


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a closed connection's TIME_WAIT is no owner
        try:
            s.bind((host, port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def port_message(host: str, port: int) -> str:
    return (f"msrun --master_port {port}: {host}:{port} is already in use by another process, so msrun's "
            f"scheduler cannot start; launch again with a free --master_port")


def guard_start():
    """Call before MindSpore's init() under msrun: the scheduler checks its port; a worker starts a watcher
    process (init() holds the interpreter, so a thread would not run) that ends it when the note appears."""
    global _WATCHER
    role = os.environ.get("MS_ROLE", "")
    host, port = _scheduler()
    if not port:
        return
    if role == "MS_SCHED":
        if port_in_use(host, port):
            with open(note_path(port), "w", encoding="utf-8") as fh:
                fh.write(f"error: {port_message(host, port)}\n")
            raise ConfigError(port_message(host, port))
    elif role == "MS_WORKER" and _WATCHER is None:
        _WATCHER = subprocess.Popen([sys.executable, "-c", _WATCH, note_path(port), str(os.getpid())])


def started():
    """init() returned: the cluster is up, no note can come for this launch."""
    global _WATCHER
    if _WATCHER is not None:
        _WATCHER.kill()
        _WATCHER.wait()
        _WATCHER = None


_WATCHER = None
# the watcher: until its worker is gone, look for the note; on it, print it to the worker's stderr and end
# the worker (exit code -9 in msrun's report; the log says why)
_WATCH = """
import os, sys, time
note, pid = sys.argv[1], int(sys.argv[2])
while True:
    time.sleep(0.5)
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(0)
    if os.path.exists(note):
        sys.stderr.write(open(note).read())
        sys.stderr.flush()
        os.kill(pid, 9)
        sys.exit(0)
"""
