"""An existing torchrun (or torch.distributed.launch / deepspeed) worker.

torchrun gives every worker ``TORCHELASTIC_RUN_ID``, ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``, ``LOCAL_WORLD_SIZE`` and
``GROUP_WORLD_SIZE``. A process with those variables is already one worker
of a running job, so starting our launcher there would start every worker a
second time. This detector sits before every scheduler detector (a torchrun
inside an srun step is still a torchrun worker) and reports ``source =
"torchrun"``; the launchers refuse such an environment with
``refuse_nested_launch``. User code calling ``get_cluster_info()`` in a
plain ``torchrun --nproc_per_node=N train.py`` gets ``None`` (Determined's
local mode: torchrun is neither our launcher nor a scheduler), while
``core.init()`` there still runs on this detector's answer.

Our own launchers' workers have ``DET_CLUSTER_INFO_FILE`` set, so the file
detector answers for them first and this one never sees them.

torchrun does not tell a worker the other nodes' addresses, so for a
multi-node torchrun job this detector raises: give such workers a
cluster-info file, or launch with ``python -m determined_launch.torch_distributed``
instead of torchrun.
"""

from __future__ import annotations

from collections.abc import Mapping

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.hostlist import env_int, resolve_hosts
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import ClusterInfoError, LaunchError

#: torchrun sets it; torch.distributed.launch (legacy) and deepspeed's
#: launcher do not, but set the three rank variables below.
RUN_ID = "TORCHELASTIC_RUN_ID"
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


class TorchrunEnv(Detector):
    """A process started by torchrun (or a launcher like it)."""

    name = "torchrun"

    def detect(self, env: Mapping[str, str]) -> Detection:
        if RUN_ID not in env and not all(v in env for v in RANK_VARS):
            return NoMatch(f"neither {RUN_ID} nor all of {', '.join(RANK_VARS)} are set")
        world = env_int(env, "WORLD_SIZE", minimum=1)
        local_world = (
            env_int(env, "LOCAL_WORLD_SIZE", minimum=1) if "LOCAL_WORLD_SIZE" in env else world
        )
        nodes = env_int(env, "GROUP_WORLD_SIZE", minimum=1) if "GROUP_WORLD_SIZE" in env else 1
        if nodes > 1 or local_world != world:
            raise ClusterInfoError(
                f"this process is rank {env.get('RANK')} of a {world}-process torchrun job that "
                "spans several nodes, and torchrun does not tell a worker the other nodes' "
                "addresses; set DET_CLUSTER_INFO_FILE for it, or start the job with "
                "python -m determined_launch.torch_distributed instead of torchrun"
            )
        master = env.get("MASTER_ADDR", "127.0.0.1")
        addrs = resolve_hosts([master], "MASTER_ADDR")
        return ClusterInfo.from_mapping(
            {"container_addrs": addrs, "container_rank": 0, "container_slot_counts": [world]},
            source=self.name,
            where=f"torchrun worker (RANK={env.get('RANK')}, WORLD_SIZE={world})",
        )


def refuse_nested_launch(info: ClusterInfo, env: Mapping[str, str]) -> None:
    """Stop a launcher that was started inside a torchrun worker.

    Launchers call this right after detection: starting workers from a
    worker would double the world, so we stop with the two ways out.
    """
    if info.source != TorchrunEnv.name:
        return
    raise LaunchError(
        f"already inside a torchrun worker (RANK={env.get('RANK')}, "
        f"WORLD_SIZE={env.get('WORLD_SIZE')}, {RUN_ID}={env.get(RUN_ID, '-')}); launching here "
        "would start every worker again. Run your script directly under torchrun, or replace "
        "torchrun with python -m determined_launch.torch_distributed "
        "(DET_LAUNCH_DISABLE_DETECTORS=torchrun ignores these variables)"
    )
