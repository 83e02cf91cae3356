"""The code interpreter's sandbox: each protection has a test that fails without it (timeout, memory, processes,
network, the trainer's files, writes outside its temp dir, the trainer's environment), output truncation, the
command line's JSON line, start-up without MindSpore, the round-trip time, and the SandboxFusion client against a
local HTTP server (the real SandboxFusion service is not available here)."""
import ast
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from mindrlhf.tools import sandbox as sb
from mindrlhf.tools.sandbox import LocalSandbox, SandboxFusionClient, SandboxLimits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARGIN = 1.0        # seconds a run may exceed its timeout on a loaded 2-core machine


@pytest.fixture(scope="module")
def box():
    """The bubblewrap sandbox. Without bwrap: skipped when not root (cannot install it), failed as root (CI:
    scripts/test.sh installs it, so these tests must run there)."""
    s = LocalSandbox(SandboxLimits(timeout=5, memory_mb=512, max_processes=16), warn=False)
    if s.backend != "bwrap":
        why = f"no bubblewrap sandbox ({s.why_no_bwrap})"
        if os.geteuid() == 0:
            pytest.fail(why + " (as root scripts/test.sh installs it: apt-get install -y bubblewrap)")
        pytest.skip(why)
    return s


def test_ok_error_and_killed_statuses(box):
    r = box.run("print(1+1)")
    assert (r.status, r.stdout, r.exit_code, r.backend, r.protections_off) == ("ok", "2\n", 0, "bwrap", [])
    r = box.run("import sys\nprint('out')\nraise ValueError('boom')")
    assert r.status == "error" and r.exit_code == 1 and r.stdout == "out\n" and "ValueError: boom" in r.stderr
    assert "_BOOT" not in r.stderr and 'File "<code>", line 3' in r.stderr
    assert box.run("import sys; sys.exit(3)").exit_code == 3
    assert box.run("print('\u00e9 \u4e2d')").stdout == "\u00e9 \u4e2d\n"            # UTF-8 both ways
    r = box.run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.status == "killed" and r.signal == 9
    r = box.run("def (:")
    assert r.status == "error" and "SyntaxError" in r.stderr


def test_round_trip_median(box):
    """print(1+1) through the in-process API; the bar is 0.1 s on an idle machine, asserted at 0.5 s here
    (other jobs share the 2 cores). The measured median is printed (pytest -s)."""
    box.run("print(1+1)")
    times = []
    for _ in range(15):
        t = time.perf_counter()
        r = box.run("print(1+1)")
        times.append(time.perf_counter() - t)
        assert r.stdout == "2\n"
    median = statistics.median(times)
    print(f"\nsandbox print(1+1) round trip: median {median * 1000:.1f} ms over {len(times)} runs")
    assert median < 0.5


# ---- each protection, with a test that fails without it -------------------------------------------------------------
@pytest.mark.parametrize("code", ["while True: pass",
                                  "import time\nwhile True: time.sleep(1)",
                                  # hostile: ignores SIGTERM, forks children that leave the session and keep the
                                  # output pipes open
                                  "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                  "for _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n"
                                  "        time.sleep(60)\ntime.sleep(60)",
                                  "while True: print('x' * 1000)"],
                         ids=["busy", "sleeping", "forks_and_escapes", "floods_output"])
def test_timeout_bounds_the_run(box, code):
    start = time.monotonic()
    r = box.run(code, timeout=1.0)
    took = time.monotonic() - start
    assert r.status == "timeout" and r.exit_code is None and "timed out after 1 s" in r.stderr
    assert took < 1.0 + MARGIN, took


@pytest.mark.parametrize("mode", ["bwrap", "rlimits-only"])
def test_closing_its_output_does_not_end_the_wait(mode, request):
    """A program that closes stdout/stderr and runs on is waited for (up to its timeout), not killed early.
    (Under bwrap its own processes hold the pipes too; without it the pipes close with the program's.)"""
    box = request.getfixturevalue("box") if mode == "bwrap" else LocalSandbox(use_bwrap=False, warn=False)
    r = box.run("import os, time\nos.close(1); os.close(2)\ntime.sleep(0.5)\nos._exit(4)", timeout=5)
    assert (r.status, r.exit_code) == ("error", 4) and r.seconds >= 0.5, r
    start = time.monotonic()
    r = box.run("import os, time\nos.close(1); os.close(2)\ntime.sleep(60)", timeout=1)
    assert r.status == "timeout" and time.monotonic() - start < 1 + MARGIN, r


def test_memory_limit(box):
    r = box.run("x = bytearray(2_000_000_000)\nprint('allocated', len(x))", memory_mb=256)
    assert r.status in ("error", "killed") and "allocated" not in r.stdout, r
    assert "MemoryError" in r.stderr or r.status == "killed"


def test_process_limit_bounds_a_fork_bomb(box):
    code = ("import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
            "    n += 1\nprint('forked', n)")
    start = time.monotonic()
    r = box.run(code, timeout=5)
    assert r.status == "ok", r
    assert int(r.stdout.split()[-1]) < 16, r.stdout
    assert time.monotonic() - start < 5      # the sleeping children died with the run


def test_no_network(box):
    """A server on the host's loopback is out of reach (and so is everything else: no interface is up)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = (f"import socket\ns = socket.socket()\ns.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {port}))\n"
            "    print('connected')\nexcept OSError as e:\n    print('refused', e)\n"
            "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    print('connected out')\n"
            "except OSError as e:\n    print('no route', e)")
    try:
        r = box.run(code)
    finally:
        srv.close()
    assert "connected" not in r.stdout and "refused" in r.stdout and "no route" in r.stdout, r


@pytest.fixture
def world_readable_secret():
    """A file any uid could read (so only the sandbox's filesystem view keeps it out)."""
    d = tempfile.mkdtemp(prefix="trainer_ckpt_")
    os.chmod(d, 0o777)
    path = os.path.join(d, "secret.txt")
    with open(path, "w") as fh:
        fh.write("TRAINER-SECRET")
    os.chmod(path, 0o644)
    yield d, path
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


def test_cannot_see_the_trainers_files(box, world_readable_secret):
    d, secret = world_readable_secret
    targets = [secret, os.path.join(ROOT, "README.md"), os.path.abspath(sb.__file__), os.path.expanduser("~")]
    code = ("import os\nfor p in %r:\n    try:\n        print(p, 'GOT', open(p).read()[:20] if os.path.isfile(p) "
            "else os.listdir(p)[:3])\n    except OSError as e:\n        print(p, 'denied', type(e).__name__)\n"
            "print(sorted(os.listdir('/')))" % (targets,))
    r = box.run(code)
    assert r.status == "ok", r
    assert "GOT" not in r.stdout and "TRAINER-SECRET" not in r.stdout, r.stdout
    assert r.stdout.count("denied") == len(targets)
    top = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    assert not {"work", "root", "home", "mnt", "farm"} & set(top), top


def test_writes_only_to_its_own_temp_dir(box, world_readable_secret):
    d, _ = world_readable_secret           # a host directory anyone may write to
    outside = os.path.join(d, "planted.txt")
    mine = f"/tmp/mine_{os.getpid()}_{time.monotonic_ns()}.txt"      # the sandbox's /tmp, not the host's
    code = (f"import os\nopen({mine!r}, 'w').write('ok'); print('tmp', open({mine!r}).read())\n"
            "for p in %r:\n    try:\n        open(p, 'w').write('x'); print(p, 'WROTE')\n"
            "    except OSError as e:\n        print(p, 'denied', type(e).__name__)" % (
                [outside, "/usr/planted.txt", "/planted.txt", "/dev/planted.txt", "/etc/planted.txt"],))
    r = box.run(code)
    assert "tmp ok" in r.stdout and "WROTE" not in r.stdout and r.stdout.count("denied") == 5, r
    assert not os.path.exists(outside)
    assert not os.path.exists(mine)


def test_no_trainer_environment(box, monkeypatch):
    monkeypatch.setenv("MINDRLHF_TRAINER_SECRET", "s3cret-token")
    r = box.run("import os, json; print(json.dumps(dict(os.environ)))")
    env = json.loads(r.stdout)
    assert "s3cret-token" not in r.stdout and "MINDRLHF_TRAINER_SECRET" not in env
    assert set(env) <= {"PATH", "HOME", "LANG", "PYTHONIOENCODING", "PWD", "LC_CTYPE", "OMP_NUM_THREADS",
                        "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}, env


def test_output_is_truncated_without_holding_it(box):
    start = time.monotonic()
    r = box.run("import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 100000)\nprint('end')", timeout=10)
    assert r.status == "ok" and r.truncated and len(r.stdout) == box.limits.max_output_bytes
    assert time.monotonic() - start < 10


# ---- without bubblewrap ------------------------------------------------------------------------------------------
def test_without_bwrap_startup_says_which_protections_are_off(monkeypatch):
    with pytest.warns(RuntimeWarning, match="protections OFF: filesystem view"):
        s = LocalSandbox(use_bwrap=False)
    r = s.run("print(2 * 21)")
    assert r.status == "ok" and r.stdout == "42\n" and r.backend == "rlimits-only"
    assert any("network" in p for p in r.protections_off) and any("filesystem" in p for p in r.protections_off)
    monkeypatch.setattr(sb, "bwrap_path", lambda: None)
    with pytest.warns(RuntimeWarning, match="not installed"):
        assert LocalSandbox().backend == "rlimits-only"
    with pytest.raises(RuntimeError, match="not installed"):
        LocalSandbox(use_bwrap=True)


def test_without_bwrap_limits_still_hold():
    with pytest.warns(RuntimeWarning):
        s = LocalSandbox(SandboxLimits(timeout=1, memory_mb=256), use_bwrap=False)
    start = time.monotonic()
    assert s.run("while True: pass", timeout=1).status == "timeout"
    assert time.monotonic() - start < 1 + MARGIN
    r = s.run("x = bytearray(2_000_000_000)\nprint('allocated')", memory_mb=256)
    assert "allocated" not in r.stdout and r.status in ("error", "killed")
    assert "s3cret" not in s.run("import os; print(os.environ)").stdout


# ---- the command line and the import ------------------------------------------------------------------------------
def _env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_cli_prints_one_json_line():
    proc = subprocess.run([sys.executable, "-m", "mindrlhf.tools.sandbox", "--timeout", "5", "--memory_mb", "256"],
                          input="print(6 * 7)\n", capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert {"status", "stdout", "stderr", "exit_code", "seconds"} <= set(out)
    assert (out["status"], out["stdout"], out["exit_code"]) == ("ok", "42\n", 0)
    proc = subprocess.run([sys.executable, "-m", "mindrlhf.tools.sandbox", "--timeout", "1"], input="while 1: pass",
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert json.loads(proc.stdout)["status"] == "timeout"
    proc = subprocess.run([sys.executable, "-m", "mindrlhf.tools.sandbox", "--timeout", "0"], input="",
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 2 and "timeout must be > 0" in proc.stderr


def test_tools_start_without_mindspore():
    code = ("import sys, mindrlhf.tools, mindrlhf.tools.sandbox, mindrlhf.tools.runner, mindrlhf.tools.registry, "
            "mindrlhf.tools.parser, mindrlhf.tools.schema\n"
            "from mindrlhf.tools import ToolRunner, CodeInterpreter, get_parser\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_tools_package_imports_only_configs_utils_and_itself():
    pkg = os.path.join(ROOT, "mindrlhf", "tools")
    bad = []
    for f in sorted(os.listdir(pkg)):
        if not f.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(open(os.path.join(pkg, f), encoding="utf-8").read())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                top = n.split(".")
                if top[0] == "mindspore" or (top[0] == "mindrlhf" and len(top) > 1
                                             and top[1] not in ("configs", "utils", "tools")):
                    bad.append(f"{f}:{node.lineno} imports {n}")
    assert not bad, bad


# ---- SandboxFusion ---------------------------------------------------------------------------------------------
class _FakeSandboxFusion(BaseHTTPRequestHandler):
    """Answers /run_code as SandboxFusion does, picking the reply by a marker in the code."""
    requests = []
    fail_504 = [0]

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        code = body["code"]
        if "GATEWAY" in code and self.fail_504[0] > 0:
            self.fail_504[0] -= 1
            return self._send(504, {"detail": "gateway timeout"})
        if "HTTP500" in code:
            return self._send(500, {"detail": "boom"})
        if "NOTJSON" in code:
            self.send_response(200)
            self.end_headers()
            return self.wfile.write(b"<html>")
        run = {"status": "Finished", "execution_time": 0.01, "return_code": 0, "stdout": "2\n", "stderr": ""}
        status = "Success"
        if "raise" in code:
            run.update(return_code=1, stdout="", stderr="Traceback ...\nValueError: x\n")
            status = "Failed"
        elif "sleep" in code:
            run.update(status="TimeLimitExceeded", return_code=None, stdout="partial\n")
            status = "Failed"
        elif "SANDBOXERROR" in code:
            return self._send(200, {"status": "SandboxError", "message": "runner crashed", "compile_result": None,
                                    "run_result": None, "files": {}})
        elif "FLOOD" in code:
            run.update(stdout="y" * 100000)
        self._send(200, {"status": status, "message": "", "compile_result": None, "run_result": run,
                         "executor_pod_name": None, "files": {}})

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fusion_url():
    server = HTTPServer(("127.0.0.1", 0), _FakeSandboxFusion)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    _FakeSandboxFusion.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()
    server.server_close()


def test_sandbox_fusion_client_request_and_statuses(fusion_url):
    client = SandboxFusionClient(fusion_url, SandboxLimits(timeout=7, memory_mb=300, max_output_bytes=1000),
                                 retry_pause=0.01)
    r = client.run("print(1+1)")
    assert (r.status, r.stdout, r.exit_code, r.backend) == ("ok", "2\n", 0, "sandbox_fusion")
    path, body = _FakeSandboxFusion.requests[-1]
    assert path == "/run_code"
    assert body == {"code": "print(1+1)", "language": "python", "compile_timeout": 7.0, "run_timeout": 7.0,
                    "memory_limit_MB": 300, "stdin": None, "files": {}, "fetch_files": []}
    r = client.run("raise ValueError('x')")
    assert r.status == "error" and r.exit_code == 1 and "ValueError" in r.stderr
    r = client.run("import time; time.sleep(100)")
    assert r.status == "timeout" and r.stdout == "partial\n"
    r = client.run("SANDBOXERROR")
    assert r.status == "error" and "SandboxError" in r.stderr and "runner crashed" in r.stderr
    r = client.run("FLOOD")
    assert r.truncated and len(r.stdout) == 1000
    _FakeSandboxFusion.fail_504[0] = 1
    n = len(_FakeSandboxFusion.requests)
    assert client.run("GATEWAY").status == "ok" and len(_FakeSandboxFusion.requests) == n + 2   # retried once
    r = client.run("HTTP500")
    assert r.status == "error" and "HTTP 500" in r.stderr
    r = client.run("NOTJSON")
    assert r.status == "error" and "sandbox_fusion" in r.stderr


def test_sandbox_fusion_unreachable_is_an_error_result():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                   # nothing listens there
    r = SandboxFusionClient(f"http://127.0.0.1:{port}/run_code").run("print(1)")
    assert r.status == "error" and "sandbox_fusion" in r.stderr
    with pytest.raises(ValueError, match="http"):
        SandboxFusionClient("localhost:8080/run_code")


def test_cli_against_sandbox_fusion(fusion_url):
    proc = subprocess.run([sys.executable, "-m", "mindrlhf.tools.sandbox", "--sandbox_fusion_url", fusion_url],
                          input="print(1+1)", capture_output=True, text=True, env=_env(), timeout=60)
    out = json.loads(proc.stdout)
    assert (out["status"], out["stdout"], out["backend"]) == ("ok", "2\n", "sandbox_fusion")
