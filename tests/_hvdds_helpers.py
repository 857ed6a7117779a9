"""Shared pieces of the Horovod and DeepSpeed tests (plans and real runs)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from determined_launch.backends.plan import JobRuntime
from determined_launch.backends.ssh import HostFacts
from determined_launch.cluster.info import ClusterInfo
from tests.conftest import (
    REPO,
    WORKERS,
    Launch,
    base_env,
    free_port_block,
    launcher_cmd,
    write_cluster_info,
)

SECRET = "0123456789abcdef0123456789abcdef"


# ------------------------------------------------------------- pure builders
def make_info(
    addrs: Sequence[str], slots: Sequence[int], rank: int = 0, secret: Optional[str] = SECRET
) -> ClusterInfo:
    data: dict[str, object] = {
        "container_addrs": list(addrs),
        "container_rank": rank,
        "container_slot_counts": list(slots),
    }
    if secret:
        data["job_secret"] = secret
    return ClusterInfo.from_mapping(data, source="test", where="test")


def make_runtime(job_dir: str = "/jobs/n0", secret: Optional[str] = SECRET) -> JobRuntime:
    return JobRuntime(
        job_dir=job_dir,
        master_port=29400,
        control_port=29401,
        dist_port=29402,
        secret=secret,
        python="/py/bin/python",
    )


def make_facts(environ: Optional[Mapping[str, str]] = None, **kw: object) -> HostFacts:
    base = {"PATH": "/usr/bin:/bin"}
    base.update(environ or {})
    kw.setdefault("ssh", "/usr/bin/ssh")
    kw.setdefault("sshd", "/usr/sbin/sshd")
    kw.setdefault("user", "alice")
    return HostFacts(environ=base, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------- real runs
def cache_dir() -> Path:
    default = Path.home() / ".cache" / "determined_launch"
    return Path(os.environ.get("DET_LAUNCH_CACHE", default))


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT op is cached (scripts/install_deepspeed.sh builds it there)."""
    default = cache_dir() / "torch_extensions"
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR", default))


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def real_env(tmp: Path, **extra: str) -> dict[str, str]:
    """``base_env`` plus: DeepSpeed's compiled op from the shared cache,
    short timeouts, and a private TMPDIR (so each node's job directory
    is findable in assertions)."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = base_env(
        DET_LAUNCH_CONNECT_TIMEOUT="90",
        DET_KILL_AFTER="3",
        TMPDIR=str(tmp),
    )
    env.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    for var in [v for v in env if v.startswith(("HOROVOD_", "DTRAIN_", "DET_LAUNCH_SSH"))]:
        del env[var]
    env.update(extra)
    return env


def worker(name: str) -> list[str]:
    return [sys.executable, str(WORKERS / name)]


def node_launches(
    tmp_path: Path,
    module: str,
    args: Sequence[str],
    addrs: Sequence[str],
    slots: Sequence[int],
    **extra: str,
) -> list[Launch]:
    """One launcher per simulated node, sharing a port block and a secret."""
    port = free_port_block()
    launches = []
    for rank in range(len(addrs)):
        info = write_cluster_info(
            tmp_path / f"node{rank}.json",
            container_addrs=list(addrs),
            container_rank=rank,
            container_slot_counts=list(slots),
            job_secret=SECRET,
        )
        env = real_env(
            tmp_path / f"tmp{rank}", DET_CLUSTER_INFO_FILE=str(info), C10D_PORT=str(port), **extra
        )
        launches.append(Launch(launcher_cmd(*args, module=module), env))
    return launches


#: A worker's report line. pdsh puts "host: " in front of remote output,
#: horovodrun "[i]<stdout>:".
_LINE = re.compile(r"^(?:\S+: |\[\d+\]<stdout>:)?\[rank=(\d+)\] world=(\d+) rank=(\d+) (.*)$", re.M)


def rank_lines(out: str) -> dict[int, dict[str, str]]:
    """``{rank: {field: value}}`` from the workers' prefixed report lines."""
    found = {}
    for prefix, world, rank, rest in _LINE.findall(out):
        assert prefix == rank, f"wrap_rank prefix {prefix} on rank {rank}'s line"
        fields = dict(re.findall(r"(\w+)=(\[[^\]]*\]|'[^']*'|\S+)", rest))
        fields["world"] = world
        found[int(rank)] = fields
    return found


__all__ = ["REPO", "Launch", "SECRET"]
