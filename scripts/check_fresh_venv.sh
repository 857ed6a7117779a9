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
#   [all]    pip install '.[all]' in ONE command (every extra but the GPU builds: they must
#            resolve together); each extra's packages import
#   [search] a 2-trial det-launch experiment of examples/search/train.py
#   [s3]     a Core API run whose checkpoints go to s3:// (moto's server, from the dev
#            environment), resumed by a second run
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SRC_REPO="$PWD"
# The dev environment's interpreter, by absolute path: after `activate`,
# a bare python3 would be the venv's.
DEV_PY=$("$PY" -c 'import sys; print(sys.executable)')

WORK=$(mktemp -d "${TMPDIR:-/tmp}/det-fresh-venv.XXXXXX")
cleanup() { if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "fresh-venv: kept $WORK"; fi; }
trap cleanup EXIT
step() { echo "fresh-venv: $*"; }

git clone -q "$SRC_REPO" "$WORK/src"
"$DEV_PY" -m venv "$WORK/venv"
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

step "[all] every extra in one install"
python -m pip install -q -e ".[all]"
python - <<'PY'
import importlib

# one module per extra of [all] (torch: above), each must import in this venv
for extra, module in [("ssh", "cryptography"), ("s3", "s3fs"), ("gcs", "gcsfs"),
                      ("azure", "adlfs"), ("tensorboard", "tensorboard"), ("search", "optuna"),
                      ("search", "matplotlib"), ("search", "psycopg"), ("mlflow", "mlflow"),
                      ("wandb", "wandb")]:
    try:
        importlib.import_module(module)
    except Exception as e:
        raise SystemExit(f"fresh-venv: [{extra}]: import {module} failed: {e}")
print("fresh-venv: every extra of [all] imports")
PY

step "[search] a 2-trial experiment"
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
# The S3 endpoint is a test tool, not part of the [s3] extra: moto's server runs
# from the machine's dev environment (scripts/install.sh --dev), outside the venv.
"$DEV_PY" - "$WORK" 2>"$WORK/moto.log" <<'PY' &
import pathlib, signal, sys

from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
server.start()
host, port = server.get_host_and_port()
pathlib.Path(sys.argv[1], "moto.url").write_text(f"http://{host}:{port}")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
signal.sigwait({signal.SIGTERM})
server.stop()
PY
MOTO_PID=$!
trap 'kill $MOTO_PID 2>/dev/null || true; cleanup' EXIT
for _ in $(seq 100); do [ -s "$WORK/moto.url" ] && break; sleep 0.2; done
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
AWS_ENDPOINT_URL=$(cat "$WORK/moto.url")
export AWS_ENDPOINT_URL
python -c 'import s3fs; s3fs.S3FileSystem().mkdir("fresh-venv")'
# Two Core API runs: the second resumes from the first's checkpoint in the bucket.
for run in 1 2; do
  (cd examples/core_api && DET_CHECKPOINT_STORAGE=s3://fresh-venv/ckpts \
     DET_RUN_DIR="$WORK/runs/s3" DET_CLUSTER_INFO_FILE=trial.json \
     python 2_checkpoints.py) >"$WORK/s3-run-$run.log" 2>&1 || { tail -20 "$WORK/s3-run-$run.log"; exit 1; }
  tail -2 "$WORK/s3-run-$run.log"
done
grep -q "resuming" "$WORK/s3-run-2.log" || { echo "fresh-venv: the second S3 run did not resume" >&2; exit 1; }
python -c 'import s3fs, sys; n = len(s3fs.S3FileSystem().find("fresh-venv/ckpts")); print(f"fresh-venv: {n} objects in s3://fresh-venv/ckpts"); sys.exit(n == 0)'
kill "$MOTO_PID"
step "all passed"
