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
bash scripts/install_bubblewrap.sh      # the code interpreter's sandbox
python -m pip install --quiet -e ".[test]"
python -m pytest -q -m "not slow" tests "$@"
