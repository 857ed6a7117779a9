#!/usr/bin/env bash
# The project's test command: installs test dependencies, then lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
bash scripts/install.sh --dev
"$PY" -m ruff check .
"$PY" -m mypy
# The README's first command and one example per extra, in a fresh venv
# without this machine's packages: a missing dependency fails here.
# (DET_SKIP_FRESH_VENV=1 skips it in a developer's repeated local runs; CI never sets it.)
if [ -z "${DET_SKIP_FRESH_VENV:-}" ]; then
  bash scripts/check_fresh_venv.sh
fi
exec "$PY" -m pytest -q -p no:cacheprovider --durations=15 "$@"
