#!/usr/bin/env bash
# Installs everything the project, its examples and its tests need, on a
# fresh Debian machine with Python >= 3.9. Idempotent: re-running is cheap.
#   bash scripts/install.sh          # package + torch (enough for the main job)
#   bash scripts/install.sh --dev    # + test tools, deepspeed, horovod, sshd, MPI, SLURM
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# One line per step on stderr (the steps are quiet and take ~100 s in all): enough to see
# where an install is without making a CI log long.
step_start=$SECONDS
step() {
  [ -n "${step_name:-}" ] && echo "install.sh: ${step_name}: done ($((SECONDS - step_start)) s)" >&2
  step_name="$1"; step_start=$SECONDS
  [ -n "$1" ] && echo "install.sh: $1..." >&2
  return 0
}

if [ "${1:-}" != "--dev" ]; then
  # torch is pinned: an unpinned torch pulls several GB of CUDA wheels.
  step "installing the package with torch (pip)"
  "$PY" -m pip install -q -e ".[torch]"
  step ""
  exit 0
fi

if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  need=()
  for pkg in openssh-server openmpi-bin pdsh iproute2 slurmctld slurmd slurm-client munge; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    step "installing ${need[*]} (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
step "installing the dev extra (pip)"
"$PY" -m pip install -q -e ".[dev]"
for extra in scripts/install_*.sh scripts/build_horovod.sh; do
  [ -f "$extra" ] || continue
  step "running $extra"
  bash "$extra"
done
# The determined==0.38.1 side environment (the peer of the compatibility tests
# and benchmarks; never our dependency), built here once and cached, so that
# its minutes of pip install are not spent inside a test's time limit.
step "the determined==0.38.1 side environment (benchmarks/peer_pytorch_env.sh)"
bash benchmarks/peer_pytorch_env.sh >/dev/null
step ""
exit 0
