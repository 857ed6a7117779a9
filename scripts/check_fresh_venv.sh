#!/usr/bin/env bash
# The README's first command, and one example per extra, in a fresh virtual
# environment WITHOUT the machine's site-packages, from a clean clone.
#
# Why: the test suite runs in the machine's Python, which may already hold
# packages (numpy!) that our extras forget to declare; a green suite then
# hides a missing install step that a new user meets in their first minute.
# Here nothing is installed but what the project's own files ask for.
#
#   bash scripts/check_fresh_venv.sh            # clone HEAD into a temp dir, check it
#   KEEP=1 bash scripts/check_fresh_venv.sh     # keep the temp dir (prints its path)
#
# Steps (each must pass; the first failure ends the script with its status):
#   [torch]  bash scripts/install.sh && det-launch --slots 4 torch -- python examples/ddp_train.py
#            python examples/pytorch/train.py --batches 20   (the PyTorch Trainer API)
#   [search] pip install '.[search]'; a 2-trial det-launch experiment of examples/search/train.py
#   [s3]     pip install '.[s3]' (+ moto's S3 server, a test tool); a Core API run whose
#            checkpoints go to s3://, resumed by a second run
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SRC_REPO="$PWD"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/det-fresh-venv.XXXXXX")
cleanup() { if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "fresh-venv: kept $WORK"; fi; }
trap cleanup EXIT
step() { echo "fresh-venv: $*"; }

git clone -q "$SRC_REPO" "$WORK/src"
"$PY" -m venv "$WORK/venv"
# shellcheck disable=SC1091
. "$WORK/venv/bin/activate"
cd "$WORK/src"
if python -c 'import numpy' 2>/dev/null; then
    echo "fresh-venv: the new venv already sees numpy: it is not isolated" >&2
    exit 1
fi

step "[torch] the README's first command"
bash scripts/install.sh
det-launch --slots 4 torch -- python examples/ddp_train.py

step "[torch] the PyTorch Trainer example"
(cd examples/pytorch && DET_RUN_DIR="$WORK/runs/pytorch" python train.py --batches 20)

step "[search] a 2-trial experiment"
python -m pip install -q -e ".[search]"
cat > "$WORK/search.yaml" <<EOF
name: fresh-venv-search
entrypoint: python3 $WORK/src/examples/search/train.py
hyperparameters:
  lr: {type: log, minval: -4, maxval: -1}
  momentum: {type: double, minval: 0.5, maxval: 0.99}
  width: {type: categorical, vals: [32, 64, 128]}
  total_batches: 50
searcher:
  name: random
  metric: loss
  smaller_is_better: true
  max_trials: 2
  max_concurrent_trials: 2
resources:
  slots_per_trial: 1
EOF
(cd "$WORK" && det-launch experiment search.yaml)
test -s "$WORK/det_experiments/fresh-venv-search/best_trial.json"

step "[s3] checkpoints in S3 (moto's server on loopback)"
python -m pip install -q -e ".[s3]" "moto[server]>=5"
python - "$WORK" <<'PY'
"""Two Core API runs against a real S3 endpoint: the second resumes from the first's checkpoint."""
import os, subprocess, sys

import boto3
from moto.server import ThreadedMotoServer

work = sys.argv[1]
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
server.start()
try:
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint,
               DET_CHECKPOINT_STORAGE="s3://fresh-venv/ckpts", DET_RUN_DIR=f"{work}/runs/s3",
               DET_CLUSTER_INFO_FILE="trial.json")
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="fresh-venv")
    cwd = "examples/core_api"
    for _ in range(2):
        out = subprocess.run([sys.executable, "2_checkpoints.py"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=300)
        print(out.stdout[-2000:], out.stderr[-2000:], sep="\n")
        if out.returncode != 0:
            raise SystemExit(f"fresh-venv: s3 run failed with status {out.returncode}")
    keys = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").list_objects_v2(
        Bucket="fresh-venv").get("KeyCount", 0)
    if not keys:
        raise SystemExit("fresh-venv: no checkpoint reached the bucket")
    print(f"fresh-venv: {keys} objects in s3://fresh-venv")
finally:
    server.stop()
PY
step "all passed"
