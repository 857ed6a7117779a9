"""Shared pieces of the Horovod and DeepSpeed tests (plans and real runs)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import psutil

from determined_launch.backends.plan import JobRuntime
from determined_launch.backends.ssh import HostFacts
from determined_launch.cluster.info import ClusterInfo

REPO = Path(__file__).resolve().parents[1]
SECRET = "0123456789abcdef0123456789abcdef"


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


# ------------------------------------------------------------- real runs
def cache_dir() -> Path:
    return Path(os.environ.get("DET_LAUNCH_CACHE", Path.home() / ".cache" / "determined_launch"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int = 3) -> int:
    """A base port whose next ``n - 1`` ports are free too (C10D_PORT+1, +2)."""
    for _ in range(100):
        base = free_port()
        if base + n >= 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port block")


def launcher_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a launcher under test: this checkout on PYTHONPATH,
    the shared extension cache, short timeouts, nothing inherited that
    would change detection."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DET_", "SLURM_", "OMPI_", "PMI_", "HOROVOD_", "DTRAIN_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "C10D_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
    )
    env.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir() / "torch_extensions"))
    env["DET_LAUNCH_CONNECT_TIMEOUT"] = "60"
    env["DET_KILL_AFTER"] = "3"
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def write_cluster_info(
    path: Path, addrs: Sequence[str], slots: Sequence[int], rank: int, secret: str = SECRET
) -> Path:
    path.write_text(
        json.dumps(
            {
                "container_addrs": list(addrs),
                "container_rank": rank,
                "container_slot_counts": list(slots),
                "job_secret": secret,
            }
        )
    )
    return path


def start_launcher(
    module: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", module, *argv],
        env=dict(env),
        cwd=str(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    """Wait for a launcher; on timeout kill its whole group and fail loudly."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"launcher did not finish within {timeout}s; output:\n{out}") from None
    return proc.returncode, out


def kill_tree(pid: int) -> None:
    try:
        parent = psutil.Process(pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def processes_mentioning(marker: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``marker`` (orphan check)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_until(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def have(tool_module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(tool_module) is not None


def have_cmd(cmd: str) -> bool:
    return shutil.which(cmd) is not None
