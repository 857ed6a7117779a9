#!/usr/bin/env bash
# Packages for tests/test_slurm_e2e.py (a real two-node SLURM cluster started
# by tests/slurm_cluster.py) and tests/test_netns_e2e.py (network namespaces).
# Debian/Ubuntu, as root; without apt or root it does nothing and those
# tests skip with the reason. Idempotent.
set -euo pipefail
pkgs=(slurmctld slurmd slurm-client munge iproute2 util-linux)
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "install_slurm.sh: needs root and apt-get; SLURM tests will skip" >&2
  exit 0
fi
need=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
exit 0
