"""``det-launch exec -- CMD...``: Determined's plain entrypoint.

CMD runs once per node, as Determined runs a non-launcher ``entrypoint``:
with this node's cluster info (``DET_CLUSTER_INFO_FILE``), the job secret
(``DET_DIST_SECRET``, so a ``DistributedContext`` built by hand across nodes
authenticates with no setup), the preemption files, and our supervision
(fail-fast across nodes, no orphans, the genuine first failure). This is how
a custom launcher (seed 001's ``launcher_main``) runs on any scheduler.

CMD is not wrapped in ``wrap_rank``: it is usually a launcher that labels its
own workers, and a second label would only repeat the first.
"""

from __future__ import annotations

from determined_launch.backends.common import worker_env
from determined_launch.backends.plan import BackendArgs, JobRuntime, LaunchPlan, ProcessSpec
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import LaunchError


def build_plan(info: ClusterInfo, runtime: JobRuntime, args: BackendArgs) -> LaunchPlan:
    if args.overrides:
        raise LaunchError(
            f"exec takes no options before '--' (got {' '.join(args.overrides)}); "
            "usage: det-launch exec -- CMD..."
        )
    return LaunchPlan(
        processes=(ProcessSpec(argv=tuple(args.script), name="the command"),),
        env=worker_env(info, runtime),
        name="exec",
    )
