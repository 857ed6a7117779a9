#!/usr/bin/env bash
# The [ssh] extra (cryptography, for the ssh modes' keys), if it is missing.
# Idempotent and quiet; scripts/install.sh --dev runs it.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import cryptography.hazmat.primitives.asymmetric.ed25519' 2>/dev/null; then
    echo "install_house: pip install 'cryptography>=41'"
    "$PYTHON" -m pip install --quiet "cryptography>=41"
fi
