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
bash scripts/install_bubblewrap.sh      # the code interpreter's sandbox
exec python -m mindrlhf.demo "$@"
