"""torchrun (``torch.distributed.run``) plans.

The command matches what Determined's ``determined.launch.torch_distributed``
runs, so scripts behave the same on and off Determined: static rendezvous at
the chief, ``--max_restarts 0`` (restarts are the scheduler's business), and
each worker wrapped in ``wrap_rank RANK`` via ``--no_python``.
"""

from __future__ import annotations

import os

from determined_launch import envvars
from determined_launch.backends.common import worker_env, wrap_rank_argv
from determined_launch.backends.plan import BackendArgs, JobRuntime, LaunchPlan, ProcessSpec
from determined_launch.cluster.info import ClusterInfo

#: Variables of an enclosing torchrun that must not leak into the one we start.
PARENT_TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)


def master_addr(info: ClusterInfo) -> str:
    """The chief's address; loopback for one node, so nothing listens outside."""
    return "127.0.0.1" if info.single_node else info.chief_ip


#: torchrun options that decide where its log files go: given any of them,
#: the user wants those files, so ``--log-dir`` is left to torchrun.
_LOG_OPTIONS = ("--log-dir", "--log_dir", "--redirects", "--tee")
_LOG_SHORT = ("-r", "-t")  # also with the value attached: -r3


def log_dir_args(runtime: JobRuntime, overrides: tuple[str, ...]) -> list[str]:
    """torchrun makes a ``torchelastic_*`` directory in the system temp
    directory for every run and never removes it (torch 2.13). Unless the
    user asked for torchrun's log files, point it inside the job directory,
    which is removed when the job ends. (``PET_LOG_DIR`` and the other
    ``PET_*`` spellings are overridden by this flag: use the flags.)"""
    if any(o.split("=", 1)[0] in _LOG_OPTIONS or o.startswith(_LOG_SHORT) for o in overrides):
        return []
    return ["--log-dir", os.path.join(runtime.job_dir, "torchelastic")]


def torchrun_argv(info: ClusterInfo, runtime: JobRuntime, args: BackendArgs) -> list[str]:
    """``python -m torch.distributed.run`` with our defaults, then the user's
    overrides (argparse keeps the last value, so overrides win), then the
    wrapped script."""
    return [
        runtime.python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(info.num_nodes),
        "--nproc_per_node",
        str(info.slots_per_node),
        "--node_rank",
        str(info.container_rank),
        "--master_addr",
        master_addr(info),
        "--master_port",
        str(runtime.master_port),
        "--max_restarts",
        "0",
        "--monitor_interval",
        "0.1",
        "--no_python",
        *log_dir_args(runtime, args.overrides),
        *args.overrides,
        *wrap_rank_argv(runtime, "RANK"),
        *args.script,
    ]


def build_plan(info: ClusterInfo, runtime: JobRuntime, args: BackendArgs) -> LaunchPlan:
    """One torchrun per node.

    Nodes may have different slot counts: torchrun's agents share their
    local world sizes at rendezvous and assign global ranks from them.
    """
    env = worker_env(info, runtime)
    env[envvars.USE_TORCH_DISTRIBUTED] = "true"
    return LaunchPlan(
        processes=(
            ProcessSpec(argv=tuple(torchrun_argv(info, runtime, args)), name="torchrun",
                        tool=True),
        ),
        env=env,
        unset_env=PARENT_TORCHRUN_VARS,
        name="torch_distributed",
    )
