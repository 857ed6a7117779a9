#!/usr/bin/env bash
# Runs 4_distributed.py as 2 simulated nodes x 2 slots on this machine: two
# launchers, each with its own cluster info file, exactly as two real nodes
# would run them. Pause with `kill -USR1 <pid>` of either launcher; run this
# script again to resume. Exits with node 0's status (75 = preempted).
set -uo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
# Both nodes must agree on the chief's ports (C10D_PORT and the next two)
# and on the job secret.
export C10D_PORT=${C10D_PORT:-29600}
export DET_DIST_SECRET=${DET_DIST_SECRET:-$("$python" -c 'import secrets; print(secrets.token_hex(16))')}
DET_CLUSTER_INFO_FILE=node0.json "$python" 4_distributed.py launcher &
node0=$!
DET_CLUSTER_INFO_FILE=node1.json "$python" 4_distributed.py launcher &
node1=$!
echo "two_nodes.sh: launcher pids: node 0 (chief) $node0, node 1 $node1" >&2
wait "$node1"
wait "$node0"
