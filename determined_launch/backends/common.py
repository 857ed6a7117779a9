"""Pieces every backend's plan shares: the worker environment and wrap_rank."""

from __future__ import annotations

from determined_launch import envvars
from determined_launch.backends.plan import JobRuntime
from determined_launch.cluster.info import ClusterInfo

#: Rank variables tried in order by wrap_rank, covering every backend we start.
ANY_RANK_VARS = "RANK,HOROVOD_RANK,OMPI_COMM_WORLD_RANK,PMI_RANK"


def worker_env(info: ClusterInfo, runtime: JobRuntime) -> dict[str, str]:
    """Variables every worker gets, whatever the backend.

    They point the worker-side library (``DistributedContext.from_env``,
    ``PreemptContext``, ``get_cluster_info``) at this job's private
    directory, ports and secret, so user code needs no arguments.
    """
    env = {
        envvars.CHIEF_IP: info.chief_ip,
        envvars.JOB_DIR: runtime.job_dir,
        envvars.CLUSTER_INFO_FILE: runtime.cluster_info_file,
        envvars.DIST_PORT: str(runtime.dist_port),
        envvars.DIST_IPC_DIR: runtime.ipc_dir,
        envvars.PREEMPT_SIGNAL_FILE: runtime.preempt_signal_file,
        envvars.PREEMPT_ACK_FILE: runtime.preempt_ack_file,
        envvars.PREEMPT_LISTEN_FILE: runtime.preempt_listen_file,
        envvars.WRAP_RANK_STATUS_DIR: runtime.status_dir,
    }
    if runtime.secret:
        env[envvars.DIST_SECRET] = runtime.secret
    if runtime.pythonpath is not None:
        env["PYTHONPATH"] = runtime.pythonpath
    return env


def wrap_rank_argv(runtime: JobRuntime, rank_vars: str = ANY_RANK_VARS) -> list[str]:
    """The prefix that runs a worker under wrap_rank.

    ``rank_vars`` is read from the worker's own environment at start-up, which
    is how wrap_rank learns a rank that only the backend (torchrun,
    horovodrun, deepspeed) assigns.
    """
    return [runtime.python, "-m", "wrap_rank", rank_vars, "--"]
