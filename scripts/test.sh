#!/usr/bin/env bash
# The default test suite, after installing what it needs (mindspore, the package, the test extras); what
# .ci/run calls. `--venv` first: in .venv. Other arguments go to pytest (e.g. `bash scripts/test.sh -k real_model`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--venv" ]; then     # the .venv scripts/demo.sh --venv made (created here if missing)
  shift
  [ -d .venv ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
python -m pip install --quiet "numpy<2" "mindspore==2.10.0"
# bubblewrap: the code interpreter's sandbox (mindrlhf/tools/sandbox.py). Installed when missing and we are root
# (CI); otherwise the sandbox tests that need it skip, naming why.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (the code interpreter's sandbox)"
    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "[setup] could not install bubblewrap"
  else
    echo "[setup] bubblewrap (bwrap) is missing and this is not root: the code sandbox runs with rlimits only" \
         "(sudo apt-get install -y bubblewrap)"
  fi
fi
python -m pip install --quiet -e ".[test]"
python -m pytest -q -m "not slow" tests "$@"
