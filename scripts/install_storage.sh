#!/usr/bin/env bash
# Install what object-storage checkpoints and their tests need: s3fs and
# adlfs (the [s3] and [azure] extras), moto's S3 server, tensorboardX (the
# optional TensorBoard writer) and Microsoft's azurite emulator from npm.
# gcsfs and fake-gcs-server (the claims' GCS tests) come with the dev extra;
# checkpoints on gs:// are tested through fsspec's memory filesystem. Idempotent.
set -euo pipefail
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import s3fs, adlfs, moto.server, flask_cors, tensorboardX' 2>/dev/null; then
    echo "install_storage: pip install s3fs adlfs moto[server] tensorboardX"
    "$PYTHON" -m pip install --quiet "s3fs>=2024.6" "adlfs>=2024.4" "moto[server]>=5" "tensorboardX>=2.6"
fi

if ! command -v azurite-blob >/dev/null 2>&1; then
    if command -v npm >/dev/null 2>&1; then
        echo "install_storage: npm install -g azurite"
        npm install --global --silent --no-audit --no-fund azurite >/dev/null
    else
        echo "install_storage: npm not found; Azure tests will be skipped (install node + npm)"
    fi
fi
exit 0
