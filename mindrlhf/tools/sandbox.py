"""The built-in `code_interpreter`'s back ends: a local sandbox (bubblewrap + rlimits) and a SandboxFusion client.

Local sandbox, one fresh process per run (`print(1+1)` round trip ~15-45 ms here, so no fork server):
- bubblewrap (`bwrap --unshare-all --die-with-parent --new-session`): new user, pid, net, ipc, uts, cgroup
  namespaces; the filesystem is /usr (read-only; /bin, /lib, /lib64 as the host links them), the interpreter's
  own install tree (read-only, only when it lives outside /usr), a fresh /proc and /dev (read-only: device
  nodes only), and a private tmpfs at /tmp (the writable place, `tmp_mb` large, gone with the run; /dev/shm is
  another such tmpfs, for multiprocessing's semaphores); everything else is read-only. Nothing else of the
  host: no /work, /root, /home, /etc (but ld.so.cache), checkpoints or data. No network interface but a down
  loopback.
- an unprivileged uid (65534) when the trainer runs as root: RLIMIT_NPROC is not enforced for uid 0, and the
  host's root-only files stay unreadable even where a path is shared.
- rlimits set in the child before the code runs (it cannot raise them again): RLIMIT_AS (`memory_mb`),
  RLIMIT_NPROC (`max_processes`, counted inside the run's own user namespace), RLIMIT_FSIZE, RLIMIT_CPU
  (timeout + 1 s), no core files.
- an empty environment (PATH, HOME=/tmp, LANG, one BLAS/OpenMP thread); the trainer's variables never reach
  the code.
- a wall-clock timeout: the run's process group is SIGKILLed at the deadline, and with bubblewrap its pid
  namespace goes with it (orphans, `setsid` escapes and fork bombs included).
- stdout and stderr each kept up to `max_output_bytes`; the rest is read and dropped, so a flood costs no memory.
Without bubblewrap (not installed, or refused by the kernel), start-up warns which protections are off
(filesystem view and writes, network, pid namespace) and every result lists them in `protections_off`.

`python -m mindrlhf.tools.sandbox --timeout S --memory_mb M` reads code on stdin and prints one JSON line
(`status` ok / timeout / error / killed, `stdout`, `stderr`, `exit_code`, `seconds`, ...). Importing this module
imports no MindSpore.

SandboxFusion (`SandboxFusionClient`): POST {code, language, compile_timeout, run_timeout, memory_limit_MB,
stdin, files, fetch_files} to `sandbox_fusion_url` (its `/run_code` endpoint), as verl's and MindSpeed-RL's
code tools call it; the response's `run_result` {status Finished / TimeLimitExceeded / Error, return_code,
stdout, stderr, execution_time} becomes the same result dict. The real service is not available on this
machine: the client is tested against a small local server only.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional

STATUSES = ("ok", "timeout", "error", "killed")
NOBODY = 65534
_SETPRIV = shutil.which("setpriv")   # util-linux: drops to NOBODY before exec, so Popen can still vfork
_DRAIN_GRACE = 0.2          # seconds we keep reading pipes after the process is gone (or killed)


@dataclass
class SandboxLimits:
    """Per-run limits. `timeout` is wall-clock seconds; `memory_mb` the address-space limit (RLIMIT_AS)."""
    timeout: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 32          # processes + threads of the run (RLIMIT_NPROC in its user namespace)
    max_output_bytes: int = 16384    # per stream
    max_file_mb: int = 32            # largest file the code may write (RLIMIT_FSIZE)
    tmp_mb: int = 64                 # size of the private /tmp (bubblewrap only)

    def __post_init__(self):
        for name in ("timeout", "memory_mb", "max_processes", "max_output_bytes", "max_file_mb", "tmp_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class SandboxResult:
    status: str                       # one of STATUSES
    stdout: str
    stderr: str
    exit_code: Optional[int]          # None when killed at the deadline
    seconds: float
    signal: Optional[int] = None      # the signal that ended the code, status "killed"
    truncated: bool = False           # stdout or stderr was cut at max_output_bytes
    backend: str = "bwrap"            # bwrap / rlimits-only / sandbox_fusion
    protections_off: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict:
        return asdict(self)


# Runs inside the sandbox as `python -I -c BOOT <limits...>`: set the limits (failing closed), read the code from
# stdin, run it as __main__, print its traceback without this wrapper's frame.
_BOOT = r"""
import resource as _r, sys as _s
_mem, _nproc, _fsize, _cpu = (int(a) for a in _s.argv[1:5])
for _k, _v in ((_r.RLIMIT_AS, _mem), (_r.RLIMIT_NPROC, _nproc), (_r.RLIMIT_FSIZE, _fsize), (_r.RLIMIT_CPU, _cpu),
               (_r.RLIMIT_CORE, 0)):
    if _v >= 0:
        try:
            _r.setrlimit(_k, (_v, _v))
        except (ValueError, OSError) as _e:
            _s.stderr.write("sandbox: cannot set a resource limit (%s): %s\n" % (_k, _e)); _s.exit(125)
_src = _s.stdin.read()
_s.stdin.close()
_s.stdin = open("/dev/null")
_s.argv = ["<code>"]
_g = {"__name__": "__main__", "__builtins__": __builtins__}
del _r, _mem, _nproc, _fsize, _cpu, _k, _v
try:
    exec(compile(_src, "<code>", "exec"), _g)
except SystemExit:
    raise
except BaseException as _e:
    import traceback as _t
    _t.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    _s.exit(1)
"""


def bwrap_path() -> Optional[str]:
    return shutil.which("bwrap")


def _readable_by_nobody(path: str) -> bool:
    """Every directory on the way is world-searchable and the target world-readable (an unprivileged bwrap
    must reach the interpreter to bind it)."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        p = os.sep.join(parts[:i]) or os.sep
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return False
        need = 0o001 if i < len(parts) else 0o004
        if not mode & need:
            return False
    return True


def default_python() -> str:
    """The trainer's own interpreter (same packages: numpy, sympy, ...) when an unprivileged sandbox can reach
    it, else the system's /usr/bin/python3."""
    if os.geteuid() != 0 or all(_readable_by_nobody(p) for p in (os.path.realpath(sys.executable), sys.prefix,
                                                                    sys.base_prefix)):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.path.exists(candidate):
            return candidate
    return sys.executable


def _python_trees(python: str) -> List[str]:
    """The install trees (outside /usr) the interpreter needs: its own prefix, and a venv's base."""
    trees = {os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        trees |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return sorted(t for t in trees if t != "/usr" and not t.startswith("/usr/") and t != "/")


class LocalSandbox:
    """Runs Python code in a fresh sandboxed process per call; thread-safe (calls share nothing).

    `use_bwrap`: "auto" (bubblewrap when it is installed and works, else rlimits only, with a warning), True
    (refuse to start without it) or False (rlimits only, for machines without user namespaces)."""

    def __init__(self, limits: Optional[SandboxLimits] = None, python: Optional[str] = None, use_bwrap="auto",
                 warn: bool = True):
        self.limits = replace(limits) if limits else SandboxLimits()      # our own copy: callers may change theirs
        self.python = python or default_python()
        self._drop_uid = os.geteuid() == 0
        self._bwrap = None
        reason = ""
        if use_bwrap:
            found = bwrap_path()
            if found is None:
                reason = "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
            else:
                self._bwrap = found
                ok, why = self._probe()
                if not ok:
                    self._bwrap, reason = None, f"bwrap is installed but failed here: {why}"
            if self._bwrap is None and use_bwrap is True:
                raise RuntimeError(f"sandbox: {reason}")
        self.protections_off: List[str] = []
        if self._bwrap is None:
            self.protections_off = ["filesystem view (the code can read what the sandbox uid can read)",
                                    "filesystem writes outside its temp dir (where the sandbox uid may write)",
                                    "network", "pid namespace (a process that leaves the session outlives the "
                                                "timeout)"]
            if not self._drop_uid:
                self.protections_off.append("process limit (RLIMIT_NPROC would count the trainer's own threads)")
            else:
                self.protections_off.append("a per-run process limit (RLIMIT_NPROC counts every uid-65534 process "
                                            "of the host, concurrent runs included)")
            if warn:
                warnings.warn("code sandbox without bubblewrap" + (f" ({reason})" if reason else "")
                              + "; protections OFF: " + "; ".join(self.protections_off), RuntimeWarning,
                              stacklevel=2)
        self.backend = "bwrap" if self._bwrap else "rlimits-only"
        self.why_no_bwrap = "" if self._bwrap else (reason or "use_bwrap=False")

    # ---- set-up -----------------------------------------------------------------------------------------------
    def _probe(self):
        try:
            proc = subprocess.run(self._argv(SandboxLimits()), input=b"print(1+1)", capture_output=True,
                                  env=self._env(), timeout=20, **self._uid_kwargs())
        except (OSError, subprocess.SubprocessError) as err:
            return False, f"{type(err).__name__}: {err}"
        if proc.returncode != 0 or proc.stdout.strip() != b"2":
            return False, (proc.stderr.decode(errors="replace").strip() or f"exit code {proc.returncode}")[:300]
        return True, ""

    def _uid_kwargs(self) -> Dict:
        """Popen's own uid switch, when setpriv is missing (it makes Popen fork the whole trainer, not vfork)."""
        return dict(user=NOBODY, group=NOBODY, extra_groups=[]) if self._drop_uid and not _SETPRIV else {}

    def _uid_prefix(self) -> List[str]:
        return [_SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if self._drop_uid and \
            _SETPRIV else []

    @staticmethod
    def _env() -> Dict[str, str]:
        # one BLAS / OpenMP thread: thread pools sized by the host's cores would hit the process limit
        # (UTF-8 stdio comes from LANG: `python -I` ignores PYTHON* variables)
        return {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def _argv(self, limits: SandboxLimits) -> List[str]:
        mb = 1024 * 1024
        cpu = int(limits.timeout) + 2
        nproc = limits.max_processes if (self._bwrap or self._drop_uid) else -1
        inner = [self.python, "-I", "-c", _BOOT, str(limits.memory_mb * mb), str(nproc), str(limits.max_file_mb * mb),
                 str(cpu)]
        if not self._bwrap:
            return self._uid_prefix() + inner
        argv = self._uid_prefix() + [self._bwrap, "--unshare-all", "--die-with-parent", "--new-session",
                                     "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for top in ("bin", "lib", "lib64", "lib32", "libx32", "sbin"):
            host = "/" + top
            if os.path.islink(host):
                argv += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                argv += ["--ro-bind", host, host]
        argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        for tree in _python_trees(self.python):
            argv += ["--ro-bind", tree, tree]
        size = str(limits.tmp_mb * mb)
        argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs",
                 "/dev/shm", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        for k, v in self._env().items():
            argv += ["--setenv", k, v]
        return argv + inner

    # ---- one run ----------------------------------------------------------------------------------------------
    def run(self, code: str, timeout: Optional[float] = None, memory_mb: Optional[int] = None) -> SandboxResult:
        limits = self.limits
        if timeout is not None or memory_mb is not None:
            limits = SandboxLimits(**{**asdict(limits), **({"timeout": float(timeout)} if timeout else {}),
                                      **({"memory_mb": int(memory_mb)} if memory_mb else {})})
        start = time.monotonic()
        workdir = None
        try:
            if self._bwrap:
                cwd = "/"
            else:       # rlimits only: a private dir the sandbox uid owns (the best we can do without a mount ns)
                workdir = cwd = tempfile.mkdtemp(prefix="mindrlhf_sandbox_")
                if self._drop_uid:
                    os.chown(workdir, NOBODY, NOBODY)
            try:
                proc = subprocess.Popen(self._argv(limits), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env={**self._env(), "HOME": cwd} if workdir else
                                        self._env(), cwd=cwd, start_new_session=True, close_fds=True,
                                        **self._uid_kwargs())
            except OSError as err:
                return self._result("error", "", f"sandbox: could not start: {err}", None, start)
            out, err, truncated, timed_out = _pump(proc, code.encode("utf-8", errors="replace"),
                                                   start + limits.timeout, limits.max_output_bytes)
        finally:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        code_rc = proc.returncode
        if timed_out:
            return self._result("timeout", out, err + f"\n[timed out after {limits.timeout:g} s]", None, start,
                                truncated=truncated)
        sig = None
        if code_rc < 0:
            sig = -code_rc
        elif self._bwrap and code_rc > 128 and code_rc - 128 in _SIGNALS:   # bwrap reports a signal as 128 + n
            sig = code_rc - 128
        if sig is not None:
            return self._result("killed", out, err + f"\n[killed by signal {_SIGNALS.get(sig, sig)}]", code_rc,
                                start, signal_=sig, truncated=truncated)
        return self._result("ok" if code_rc == 0 else "error", out, err, code_rc, start, truncated=truncated)

    def _result(self, status, out, err, rc, start, signal_=None, truncated=False) -> SandboxResult:
        return SandboxResult(status=status, stdout=out, stderr=err.strip("\n") if status != "ok" else err,
                             exit_code=rc, seconds=round(time.monotonic() - start, 4), signal=signal_,
                             truncated=truncated, backend=self.backend, protections_off=list(self.protections_off))


_SIGNALS = {s.value: s.name for s in signal.Signals}


def _pump(proc: subprocess.Popen, stdin_bytes: bytes, deadline: float, cap: int):
    """Feed stdin, read stdout/stderr (keeping `cap` bytes of each) until both close and the process ends, or
    the deadline: then SIGKILL its process group. Returns (stdout, stderr, truncated, timed_out)."""
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    truncated = False
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    pending = memoryview(stdin_bytes)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    timed_out = False
    exited_at = None
    try:
        while True:
            now = time.monotonic()
            running = proc.poll() is None
            if now >= deadline:
                timed_out = running
                break
            if not running:
                if not sel.get_map():
                    break
                if exited_at is None:
                    exited_at = now
                if now - exited_at > _DRAIN_GRACE:
                    break       # the code is done; something it left behind holds the pipes open
            if not sel.get_map():       # it closed its output but runs on: wait for it, up to the deadline
                try:
                    proc.wait(timeout=deadline - now)
                except subprocess.TimeoutExpired:
                    pass
                continue
            wait = min(deadline - now, 0.05 if exited_at is None else _DRAIN_GRACE)
            for key, _ in sel.select(timeout=max(wait, 0.001)):
                f = key.fileobj
                if f is proc.stdin:
                    try:
                        n = os.write(f.fileno(), pending[:65536])
                        pending = pending[n:]
                    except (BrokenPipeError, OSError):
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(f)
                        f.close()
                    continue
                try:
                    chunk = os.read(f.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(f)
                    continue
                room = cap - len(bufs[f])
                if len(chunk) > room:
                    truncated = True
                if room > 0:
                    bufs[f] += chunk[:room]
    finally:
        if proc.poll() is None or timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sel.close()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass

    def text(b):
        return bytes(b).decode("utf-8", errors="replace")
    return text(bufs[proc.stdout]), text(bufs[proc.stderr]), truncated, timed_out


# ---- SandboxFusion -------------------------------------------------------------------------------------------
class SandboxFusionClient:
    """A SandboxFusion `/run_code` client (stdlib HTTP, no extra dependency). A 504 (gateway timeout) is retried
    `retries` times with a growing pause; any other failure is an "error" result naming it, never an exception."""

    def __init__(self, url: str, limits: Optional[SandboxLimits] = None, language: str = "python",
                 retries: int = 2, retry_pause: float = 0.5, api_slack: float = 10.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"sandbox_fusion_url must be an http(s) URL, got {url!r}")
        self.url = url
        self.limits = replace(limits) if limits else SandboxLimits()
        self.language = language
        self.retries = retries
        self.retry_pause = retry_pause
        self.api_slack = api_slack
        self.backend = "sandbox_fusion"

    def request_body(self, code: str, timeout: float, memory_mb: int) -> Dict:
        return {"code": code, "language": self.language, "compile_timeout": timeout, "run_timeout": timeout,
                "memory_limit_MB": memory_mb, "stdin": None, "files": {}, "fetch_files": []}

    def run(self, code: str, timeout: Optional[float] = None, memory_mb: Optional[int] = None) -> SandboxResult:
        timeout = float(timeout or self.limits.timeout)
        memory_mb = int(memory_mb or self.limits.memory_mb)
        start = time.monotonic()
        data = json.dumps(self.request_body(code, timeout, memory_mb)).encode("utf-8")
        reply, problem = None, ""
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url, data=data, method="POST", headers={
                "Content-Type": "application/json", "Accept": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=2 * timeout + self.api_slack) as resp:
                    reply = json.loads(resp.read(8 * 1024 * 1024).decode("utf-8", errors="replace"))
                break
            except urllib.error.HTTPError as err:
                problem = f"HTTP {err.code} from {self.url}"
                if err.code != 504 or attempt == self.retries:
                    break
                time.sleep(self.retry_pause * (attempt + 1))
            except (urllib.error.URLError, OSError, ValueError) as err:
                problem = f"{type(err).__name__}: {getattr(err, 'reason', err)} ({self.url})"
                break
        if reply is None:
            return self._result("error", "", f"sandbox_fusion: {problem}", None, start)
        return self._from_reply(reply, start, timeout)

    def _from_reply(self, reply, start, timeout) -> SandboxResult:
        if not isinstance(reply, dict):
            return self._result("error", "", "sandbox_fusion: the reply is not a JSON object", None, start)
        cap = self.limits.max_output_bytes
        run = reply.get("run_result") or {}
        compiled = reply.get("compile_result") or {}
        if not isinstance(run, dict) or not run:
            msg = reply.get("message") or (compiled.get("stderr") if isinstance(compiled, dict) else "") or ""
            return self._result("error", "", f"sandbox_fusion: {reply.get('status', 'no run_result')}: {msg}",
                                None, start)
        out, err = str(run.get("stdout") or ""), str(run.get("stderr") or "")
        truncated = len(out.encode()) > cap or len(err.encode()) > cap
        out, err = _cut_bytes(out, cap), _cut_bytes(err, cap)
        rc = run.get("return_code")
        state = run.get("status")
        if state == "TimeLimitExceeded":
            return self._result("timeout", out, err + f"\n[timed out after {timeout:g} s]", None, start, truncated)
        if state == "Finished":
            return self._result("ok" if rc == 0 else "error", out, err, rc, start, truncated)
        return self._result("error", out, err or f"sandbox_fusion: run status {state!r}", rc, start, truncated)

    def _result(self, status, out, err, rc, start, truncated=False) -> SandboxResult:
        return SandboxResult(status=status, stdout=out, stderr=err.strip("\n") if status != "ok" else err,
                             exit_code=rc, seconds=round(time.monotonic() - start, 4), truncated=truncated,
                             backend=self.backend)


def _cut_bytes(s: str, cap: int) -> str:
    b = s.encode("utf-8")
    return s if len(b) <= cap else b[:cap].decode("utf-8", errors="ignore")


# ---- command line ------------------------------------------------------------------------------------------
_SHARED: Dict[str, LocalSandbox] = {}
_SHARED_LOCK = threading.Lock()


def shared_sandbox(limits: Optional[SandboxLimits] = None) -> LocalSandbox:
    """One LocalSandbox per set of limits in a process (its start-up probes bwrap once)."""
    limits = limits or SandboxLimits()
    key = json.dumps(asdict(limits), sort_keys=True)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = LocalSandbox(limits)
        return _SHARED[key]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mindrlhf.tools.sandbox",
                                description="Run Python code from stdin in the code interpreter's sandbox and print "
                                            "one JSON line: status (ok/timeout/error/killed), stdout, stderr, "
                                            "exit_code, seconds, backend, protections_off.")
    d = SandboxLimits()
    p.add_argument("--timeout", type=float, default=d.timeout, help="wall-clock seconds")
    p.add_argument("--memory_mb", type=int, default=d.memory_mb, help="address-space limit (RLIMIT_AS), MB")
    p.add_argument("--max_processes", type=int, default=d.max_processes, help="processes + threads of the run")
    p.add_argument("--max_output_bytes", type=int, default=d.max_output_bytes, help="kept per stream")
    p.add_argument("--no_bwrap", action="store_true", help="rlimits only (protections off are listed)")
    p.add_argument("--sandbox_fusion_url", default="", help="run on a SandboxFusion service instead")
    args = p.parse_args(argv)
    try:
        limits = SandboxLimits(timeout=args.timeout, memory_mb=args.memory_mb, max_processes=args.max_processes,
                               max_output_bytes=args.max_output_bytes)
    except ValueError as err:
        p.error(str(err))
    code = sys.stdin.read()
    if args.sandbox_fusion_url:
        box = SandboxFusionClient(args.sandbox_fusion_url, limits)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            box = LocalSandbox(limits, use_bwrap=not args.no_bwrap and "auto")
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
    print(json.dumps(box.run(code).to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
