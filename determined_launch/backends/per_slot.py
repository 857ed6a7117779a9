"""One wrapped worker per slot, no framework launcher: the seed tutorial's
``launcher_main()`` as a plan (see ``launcher.launch_per_slot``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from determined_launch.backends.common import worker_env, wrap_rank_argv
from determined_launch.backends.plan import JobRuntime, LaunchPlan, ProcessSpec
from determined_launch.cluster.info import ClusterInfo


def per_slot_plan(
    info: ClusterInfo,
    runtime: JobRuntime,
    worker_argv: Callable[[int, int], Sequence[str]],
) -> LaunchPlan:
    """``worker_argv(rank, local_rank)`` for every slot of this node.

    Global ranks are laid out node by node, so nodes may have different
    slot counts.
    """
    first_rank = sum(info.container_slot_counts[: info.container_rank])
    procs = []
    for local_rank in range(info.slots_per_node):
        rank = first_rank + local_rank
        procs.append(
            ProcessSpec(
                argv=(*wrap_rank_argv(runtime, str(rank)), *worker_argv(rank, local_rank)),
                name=f"rank {rank}",
                env={
                    "RANK": str(rank),
                    "LOCAL_RANK": str(local_rank),
                    "WORLD_SIZE": str(info.total_slots),
                    "LOCAL_WORLD_SIZE": str(info.slots_per_node),
                    "CROSS_RANK": str(info.container_rank),
                    "CROSS_SIZE": str(info.num_nodes),
                },
            )
        )
    return LaunchPlan(processes=tuple(procs), env=worker_env(info, runtime), name="per_slot")
