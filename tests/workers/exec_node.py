"""Run once per node by ``det-launch exec``: builds a DistributedContext by
hand from the cluster info (no launcher variables), allgathers, prints.

``FAIL_NODE=N`` makes node N exit 4 after the allgather while the others
block in a second one, which the launchers must break.
"""

import os

import determined_launch as det

info = det.get_cluster_info()
node, nodes = info.container_rank, info.num_nodes
dist = det.core.DistributedContext(
    rank=node, size=nodes, local_rank=0, local_size=1, cross_rank=node, cross_size=nodes,
    chief_ip=info.chief_ip,
)
got = dist.allgather(node * 10)
print(f"node={node} gathered={got} chief={info.chief_ip}", flush=True)
if os.environ.get("FAIL_NODE") is not None:
    if node == int(os.environ["FAIL_NODE"]):
        # At once, without interpreter teardown: the peers learn of the death
        # when the process is gone, so its exit is the first one in time.
        os._exit(4)
    dist.allgather("never completes")
dist.close()
