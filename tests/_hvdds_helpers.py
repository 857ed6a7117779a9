"""Shared pieces of the Horovod and DeepSpeed tests (plans and real runs)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from determined_launch.backends.plan import JobRuntime
from determined_launch.backends.ssh import HostFacts
from determined_launch.cluster.info import ClusterInfo
from tests.conftest import (
    LAUNCH_TMP,
    REPO,
    WORKERS,
    Launch,
    base_env,
    free_port_block,
    launcher_cmd,
    wait_for_file,
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


def _mlflow_hidden() -> str:
    """A PYTHONPATH entry on which ``import mlflow`` fails.

    DeepSpeed's autotuner imports mlflow whenever it is installed (the
    tracker tests install it), in every process that imports deepspeed:
    the runner, each node's launch.py and each worker. That costs ~4 s of
    CPU each (~30 s per two-node run on 2 cores) and none of these tests
    uses it; DeepSpeed treats the ImportError as "no mlflow", as it would
    on a machine without it."""
    hidden = Path(LAUNCH_TMP) / "mlflow-hidden"
    stub = hidden / "mlflow.py"
    if not stub.exists():
        hidden.mkdir(exist_ok=True)
        stub.write_text('raise ImportError("mlflow is hidden from the DeepSpeed tests")\n')
    return str(hidden)


def real_env(tmp: Path, **extra: str) -> dict[str, str]:
    """``base_env`` plus: DeepSpeed's compiled op from the shared cache,
    short timeouts, a private TMPDIR (so each node's job directory
    is findable in assertions), and mlflow hidden (see ``_mlflow_hidden``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = base_env(
        DET_LAUNCH_CONNECT_TIMEOUT="90",
        DET_KILL_AFTER="3",
        TMPDIR=str(tmp),
    )
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], _mlflow_hidden()])
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


def check_worker_lines(
    out: str, ranks: range, world: int, **expect: str
) -> dict[int, dict[str, str]]:
    """What every hvd_worker/ds_worker line must say: world, all_reduce sum,
    launcher variables, no leaked secret, a working DistributedContext."""
    lines = rank_lines(out)
    assert set(lines) == set(ranks), out
    for r in ranks:
        f = lines[r]
        assert f["world"] == str(world), f
        assert f["sum"] == str(world * (world + 1) // 2), f  # allreduce of rank+1
        assert f["use"] == "1" and f["chief"] == "127.0.0.1", f
        assert f["secret"] == "True" and f["leak"] == "False", f
        assert f["dctx"] == "ok", f  # DistributedContext.from_horovod / from_deepspeed
        for k, v in expect.items():
            assert f[k] == v, (k, f)
    return lines


def assert_failure_stops_both_nodes(nodes: Sequence[Launch]) -> None:
    """Rank 1 (node 1) exits 7: both launchers exit 7 quickly, name it, leave nothing."""
    assert nodes[1].wait(300) == 7, nodes[1].stdout + nodes[1].stderr
    failed_at = time.monotonic()
    assert nodes[0].wait(60) == 7, nodes[0].stdout + nodes[0].stderr
    assert time.monotonic() - failed_at < 20  # the control channel, not a gloo timeout
    for node in nodes:
        assert "job failed: rank 1 on node 1 (127.0.0.2) exited with status 7 first" in (
            node.stderr
        ), node.stderr
        assert node.leftovers() == []


def assert_sigterm_stops_every_worker(
    tmp_path: Path, launches: list[Launch], module: str, worker_file: str
) -> None:
    """SIGTERM to a single-node launcher whose workers do not watch for
    preemption: it stops them at once, exits 143 and nothing is left."""
    ready = tmp_path / "ready"
    ready.mkdir()
    env = real_env(
        tmp_path / "tmp",
        DET_LAUNCH_SLOTS="2",
        SLEEP_FOREVER="1",
        DET_PREEMPT_GRACE="1",
        READY_DIR=str(ready),
    )
    launch = Launch(launcher_cmd(*worker(worker_file), module=module), env)
    launches.append(launch)
    for r in range(2):
        wait_for_file(ready / f"rank-{r}", 300, f"rank {r}")
    launch.send_signal(signal.SIGTERM)
    assert launch.wait(60) == 128 + signal.SIGTERM, launch.stderr
    assert "no worker watches for preemption, so the job stopped at once" in launch.stderr
    assert launch.leftovers(settle=0.0) == []  # gone before the launcher exited
