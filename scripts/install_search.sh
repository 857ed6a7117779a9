#!/usr/bin/env bash
# Packages for `det-launch experiment` (issue 13) and its tests: the [search]
# extra (Optuna, matplotlib for the plot, psycopg for a PostgreSQL study),
# and Debian's PostgreSQL server for tests/test_search_postgres.py (skipped
# with the reason when it is missing). Idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -m pip install -q "optuna>=4.9,<5" "matplotlib>=3.7" "psycopg[binary]>=3.1"
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  if ! dpkg -s postgresql >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  fi
else
  echo "install_search.sh: needs root and apt-get for postgresql; its test will skip" >&2
fi
exit 0
