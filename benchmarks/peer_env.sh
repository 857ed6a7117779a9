#!/usr/bin/env bash
# Creates (once) the side environment holding the peer we measure against:
# Determined 0.38.1. It is never a dependency of this project.
# Prints the path of the side environment's python.
set -euo pipefail
venv="${DET_PEER_VENV:-$HOME/.cache/det-peer}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import determined" 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q "determined==0.38.1" pyzmq >&2
fi
echo "$venv/bin/python"
