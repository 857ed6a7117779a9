"""Reading a ``DistributedContext``'s configuration from the environment.

Rank layout comes from whichever launcher started the process (torchrun,
DeepSpeed, Horovod, OpenMPI, an MPICH-style PMI, SLURM); transport settings
(port, secret, timeout, ipc directory) from ``DET_DIST_*`` variables that our
launchers set. Pure functions of a mapping, so every branch has a unit test.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
from collections.abc import Mapping
from typing import Callable, Optional, TypeVar

from determined_launch import envvars, values
from determined_launch.cluster.hostlist import expand_hostlist, lookup_address, parse_task_counts
from determined_launch.core.distributed.errors import DistributedConfigError
from determined_launch.core.distributed.transport.chan import TRANSPORTS
from determined_launch.errors import ClusterInfoError

logger = logging.getLogger("determined_launch.core.distributed")

#: Chief port when nothing else says: torchrun's default master port + 2,
#: the same offset our launchers use (master, control channel, dist).
DEFAULT_PORT = 29502
MIN_SECRET_CHARS = 16
TRANSPORT_VAR = envvars.DIST_TRANSPORT


@dataclasses.dataclass(frozen=True)
class Layout:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    #: Which launcher's variables these came from, for messages.
    source: str
    chief_ip: Optional[str] = None


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        raise DistributedConfigError(f"environment variable {name} is not set")
    try:
        return int(value.strip())
    except ValueError:
        raise DistributedConfigError(f"{name}={value!r} is not an integer") from None


def _chief(env: Mapping[str, str], *fallbacks: str) -> Optional[str]:
    for name in (envvars.CHIEF_IP, *fallbacks):
        if env.get(name):
            return env[name]
    return None


def _block_layout(rank: int, size: int, local_rank: int, local_size: int, source: str) -> Layout:
    """Node index from rank for launchers that do not export it: valid when
    nodes hold equal, contiguous blocks of ranks (MPI's default mapping)."""
    if local_size <= 0 or size % local_size:
        raise DistributedConfigError(
            f"{source}: cannot derive the node layout (size {size} is not a multiple of "
            f"local size {local_size}); construct DistributedContext(...) with explicit "
            "cross_rank and cross_size"
        )
    cross_rank, cross_size = rank // local_size, size // local_size
    return Layout(rank, size, local_rank, local_size, cross_rank, cross_size, source)


def read_torchrun(env: Mapping[str, str]) -> Optional[Layout]:
    if "LOCAL_WORLD_SIZE" not in env or "RANK" not in env:
        return None
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    local_rank, local_size = _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE")
    if "GROUP_RANK" in env and "GROUP_WORLD_SIZE" in env:
        layout = Layout(
            rank,
            size,
            local_rank,
            local_size,
            _int(env, "GROUP_RANK"),
            _int(env, "GROUP_WORLD_SIZE"),
            "torchrun",
        )
    else:
        layout = _block_layout(rank, size, local_rank, local_size, "torchrun")
    return dataclasses.replace(layout, chief_ip=_chief(env, "MASTER_ADDR"))


def read_deepspeed(env: Mapping[str, str]) -> Optional[Layout]:
    if "CROSS_RANK" not in env or "RANK" not in env:
        return None
    return Layout(
        _int(env, "RANK"),
        _int(env, "WORLD_SIZE"),
        _int(env, "LOCAL_RANK"),
        _int(env, "LOCAL_SIZE"),
        _int(env, "CROSS_RANK"),
        _int(env, "CROSS_SIZE"),
        "deepspeed",
        _chief(env, "MASTER_ADDR"),
    )


def read_horovod(env: Mapping[str, str]) -> Optional[Layout]:
    if "HOROVOD_RANK" not in env:
        return None
    return Layout(
        _int(env, "HOROVOD_RANK"),
        _int(env, "HOROVOD_SIZE"),
        _int(env, "HOROVOD_LOCAL_RANK"),
        _int(env, "HOROVOD_LOCAL_SIZE"),
        _int(env, "HOROVOD_CROSS_RANK"),
        _int(env, "HOROVOD_CROSS_SIZE"),
        "horovod",
        _chief(env),
    )


def read_openmpi(env: Mapping[str, str]) -> Optional[Layout]:
    ompi = "OMPI_COMM_WORLD_"
    names = (ompi + "RANK", ompi + "SIZE", ompi + "LOCAL_RANK", ompi + "LOCAL_SIZE")
    return _read_mpi(env, names, "openmpi")


def read_pmi(env: Mapping[str, str]) -> Optional[Layout]:
    return _read_mpi(env, ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"), "pmi")


def _read_mpi(
    env: Mapping[str, str], names: tuple[str, str, str, str], source: str
) -> Optional[Layout]:
    """An MPI launcher's rank, size, local rank and local size (``names``),
    ranks placed node by node; the chief from ``MASTER_ADDR``."""
    if names[0] not in env:
        return None
    rank, size, local_rank, local_size = (_int(env, name) for name in names)
    layout = _block_layout(rank, size, local_rank, local_size, source)
    return dataclasses.replace(layout, chief_ip=_chief(env, "MASTER_ADDR"))


def read_slurm(env: Mapping[str, str]) -> Optional[Layout]:
    if "SLURM_PROCID" not in env:
        return None
    node = _int(env, "SLURM_NODEID")
    tasks_var = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else (
        "SLURM_TASKS_PER_NODE"
    )
    per_node = _slurm(parse_task_counts, env.get(tasks_var, ""), tasks_var)
    if node >= len(per_node):
        raise DistributedConfigError(
            f"{tasks_var}={env.get(tasks_var, '')!r} does not cover SLURM_NODEID={node}"
        )
    size_var = "SLURM_NTASKS" if "SLURM_NTASKS" in env else "SLURM_NPROCS"
    return Layout(
        _int(env, "SLURM_PROCID"),
        _int(env, size_var),
        _int(env, "SLURM_LOCALID"),
        per_node[node],
        node,
        len(per_node),
        "slurm",
        _chief(env, "MASTER_ADDR") or slurm_chief(env),
    )


def slurm_chief(env: Mapping[str, str]) -> Optional[str]:
    """The step's first host, expanded by the one hostlist parser the
    launcher uses (``r[1-2]n[1-2]`` starts with ``r1n1``)."""
    var = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodelist = env.get(var, "")
    if not nodelist.strip():
        return None
    return _slurm(expand_hostlist, nodelist, var)[0]


def check_chief_resolves(layout: Layout, env: Mapping[str, str]) -> None:
    """A non-chief node of a SLURM step dials the nodelist's first host:
    say at once when that name does not resolve, instead of after a whole
    timeout waiting for the chief's welcome."""
    if layout.source != "slurm" or layout.cross_rank == 0 or not layout.chief_ip:
        return
    if env.get("MASTER_ADDR") or env.get(envvars.CHIEF_IP):
        return
    if lookup_address(layout.chief_ip) is None:
        var = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
        raise DistributedConfigError(
            f"{var}={env.get(var, '')!r}: its first host {layout.chief_ip!r} (the chief) does "
            "not resolve on this host; set MASTER_ADDR to the chief's address"
        )


def read_tf_config(env: Mapping[str, str]) -> Optional[Layout]:
    """TensorFlow's ``TF_CONFIG`` as Determined 0.38.1's ``from_tf_config``
    reads it: only ``worker`` tasks; with several workers, one worker per
    node (rank = cross rank = ``task.index``) and the chief on the first
    worker's host. None when it is unset or names a single worker (a
    size-1 context). Anything malformed is an error naming the field."""
    raw = env.get("TF_CONFIG")
    if raw is None:
        return None
    try:
        config = json.loads(raw)
        task, workers = config["task"], config["cluster"]["worker"]
        task_type, index = task["type"], task.get("index", 0)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else "not JSON with task and cluster"
        raise DistributedConfigError(f"TF_CONFIG: {detail} ({raw!r})") from None
    if task_type != "worker":
        raise DistributedConfigError(
            "DistributedContext.from_tf_config() supports only worker tasks (the default "
            "strategy, MirroredStrategy or MultiWorkerMirroredStrategy), but TF_CONFIG has "
            f"task type {task_type!r}"
        )
    if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
        raise DistributedConfigError(
            f"TF_CONFIG: cluster.worker is not a list of host:port strings ({raw!r})"
        )
    if len(workers) <= 1:
        return None
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(workers):
        raise DistributedConfigError(
            f"TF_CONFIG: task.index {index!r} is not a worker index (0..{len(workers) - 1})"
        )
    n = len(workers)
    return Layout(index, n, 0, 1, index, n, "TF_CONFIG", _host_of(workers[0]))


def _host_of(address: str) -> str:
    """``host:port`` -> host; ``[v6]:port`` -> v6 (Determined splits at the
    first colon, which breaks IPv6 literals)."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    return address.rpartition(":")[0] if address.count(":") == 1 else address


_T = TypeVar("_T")


def _slurm(parse: Callable[[str, str], _T], value: str, var: str) -> _T:
    try:
        return parse(value, var)
    except ClusterInfoError as e:
        raise DistributedConfigError(str(e)) from None


#: In order: a torchrun or DeepSpeed worker also sees its allocation's SLURM
#: or MPI variables (which describe the launcher, not the worker).
READERS: tuple[Callable[[Mapping[str, str]], Optional[Layout]], ...] = (
    read_torchrun,
    read_deepspeed,
    read_horovod,
    read_openmpi,
    read_pmi,
    read_slurm,
)


def detect(env: Mapping[str, str]) -> Optional[Layout]:
    for reader in READERS:
        layout = reader(env)
        if layout is not None:
            return layout
    return None


# ------------------------------------------------------------ transport knobs
def resolve_port(port: Optional[int], env: Mapping[str, str]) -> int:
    if port is None:
        if env.get(envvars.DIST_PORT):
            port, where = _int(env, envvars.DIST_PORT), envvars.DIST_PORT
        elif env.get("MASTER_PORT"):
            port, where = _int(env, "MASTER_PORT") + 2, "MASTER_PORT + 2"
        else:
            port, where = DEFAULT_PORT, "the default"
    else:
        where = "port="
    if not 1 <= port <= 65535:
        raise DistributedConfigError(f"DistributedContext port {port} (from {where}) is invalid")
    return port


def resolve_secret(secret: Optional[str], env: Mapping[str, str]) -> Optional[str]:
    value = secret if secret is not None else env.get(envvars.DIST_SECRET)
    if not value:
        return None
    if len(value) < MIN_SECRET_CHARS:
        where = "secret=" if secret is not None else envvars.DIST_SECRET
        raise DistributedConfigError(
            f"DistributedContext secret from {where} is too short ({len(value)} characters; "
            f"use at least {MIN_SECRET_CHARS}, for example the output of "
            "`python -c 'import secrets; print(secrets.token_hex(16))'`)"
        )
    return value


def resolve_timeout(timeout: Optional[float], env: Mapping[str, str]) -> Optional[float]:
    if timeout is None:
        raw = env.get(envvars.DIST_TIMEOUT, "").strip()
        if not raw:
            return None
        try:
            timeout = values.seconds(raw, positive=True)
        except ValueError as e:
            raise DistributedConfigError(f"{envvars.DIST_TIMEOUT}: {e}") from None
    if not timeout > 0 or timeout == float("inf"):
        raise DistributedConfigError(f"DistributedContext timeout {timeout} must be positive")
    return timeout


def private_dir(path: Optional[str]) -> Optional[str]:
    """``path`` if it is a directory only this user can use (0700), else None.

    An ipc socket's file permissions are what keeps other local users away
    from it, so a directory that is missing or shared is not used (loopback
    TCP, still authenticated, is used instead).
    """
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        logger.warning("%s=%s does not exist; using loopback TCP", envvars.DIST_IPC_DIR, path)
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        logger.warning(
            "%s=%s is not a private (0700) directory of this user; using loopback TCP",
            envvars.DIST_IPC_DIR,
            path,
        )
        return None
    return path


def resolve_transport(transport: Optional[str], env: Mapping[str, str]) -> str:
    value = transport or env.get(TRANSPORT_VAR) or TRANSPORTS[0]
    if value not in TRANSPORTS:
        where = "transport=" if transport else TRANSPORT_VAR
        raise DistributedConfigError(
            f"DistributedContext transport {value!r} (from {where}) is not one of "
            + ", ".join(TRANSPORTS)
        )
    return value
