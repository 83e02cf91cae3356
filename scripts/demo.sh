#!/usr/bin/env bash
# One command for a new user: install (into the active environment, or a fresh .venv with --venv), then run
# the whole pipeline on built-in tiny defaults. Extra arguments go to `python -m mindrlhf.demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--venv" ]; then
  shift
  python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
if ! python -c "import mindspore, mindrlhf" >/dev/null 2>&1; then
  echo "[setup] installing mindspore 2.10.0 and mindrlhf (first run only; about 2.5 GB)"
  python -m pip install --quiet "numpy<2" "mindspore==2.10.0"
  python -m pip install --quiet -e ".[plot]"
fi
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
exec python -m mindrlhf.demo "$@"
