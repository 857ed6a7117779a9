#!/usr/bin/env bash
# The project's test command: installs test dependencies, then lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
bash scripts/install.sh --dev
"$PY" -m ruff check .
"$PY" -m mypy
exec "$PY" -m pytest -q -p no:cacheprovider --durations=15 "$@"
