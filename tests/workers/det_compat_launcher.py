"""A custom launcher in the pattern of Determined's tutorial 4, run once per
node by ``det-launch exec``: it starts its workers with Determined's module
name, ``python3 -m determined.launch.wrap_rank RANK -- ...``, unchanged.

Each worker builds a DistributedContext by hand across the nodes, allgathers
its rank, and reports what ``import determined`` says outside the entry points.
"""

import subprocess
import sys

import determined_launch as det


def launcher_main(slots: int, cross_rank: int) -> int:
    procs = []
    for local_rank in range(slots):
        rank = cross_rank * slots + local_rank
        cmd = [sys.executable, "-m", "determined.launch.wrap_rank", str(rank), "--",
               sys.executable, __file__, "worker", str(rank), str(local_rank)]
        procs.append(subprocess.Popen(cmd))
    return max(p.wait() for p in procs)


def worker_main(info: "det.ClusterInfo", rank: int, local_rank: int) -> None:
    slots, nodes = len(info.slot_ids), len(info.container_addrs)
    dist = det.core.DistributedContext(
        rank=rank, size=slots * nodes, local_rank=local_rank, local_size=slots,
        cross_rank=info.container_rank, cross_size=nodes, chief_ip=info.container_addrs[0],
    )
    got = dist.allgather(rank)
    try:
        import determined  # noqa: F401

        hint = "imported"
    except ImportError as e:
        hint = str(e)
    print(f"worker rank={rank} gathered={got} import determined: {hint}", flush=True)
    dist.close()


if __name__ == "__main__":
    info = det.get_cluster_info()
    if sys.argv[1:2] == ["worker"]:
        worker_main(info, int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(launcher_main(len(info.slot_ids), info.container_rank))
