#!/usr/bin/env bash
# bubblewrap: the code interpreter's sandbox (mindrlhf/tools/sandbox.py). Installed when missing and we are root
# (CI); otherwise the sandbox tests that need it skip, naming why. Sourced by scripts/test.sh and scripts/demo.sh.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (the code interpreter's sandbox)"
    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "[setup] could not install bubblewrap"
  else
    echo "[setup] bubblewrap (bwrap) is missing and this is not root: the code sandbox runs with rlimits only" \
         "(sudo apt-get install -y bubblewrap)"
  fi
fi
