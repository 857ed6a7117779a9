"""Shared test plumbing: run the package from this checkout in subprocesses,
pick free ports, and prove that no process outlives its launcher."""

from __future__ import annotations

import compileall
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import psutil
import pytest

from tests._ports import free_port_block  # noqa: F401  (tests import it from here)

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"
#: Every process a test starts carries this variable (inherited by all
#: descendants), so leftovers can be found by their environment.
MARKER = "DET_LAUNCH_TEST_MARKER"
#: TMPDIR of every launcher a test starts: a failed job keeps its launcher
#: tools' log beside its job directory, and tests must not litter /tmp.
LAUNCH_TMP = tempfile.mkdtemp(prefix="det-launch-tests-")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package once: where the machine sets PYTHONDONTWRITEBYTECODE (containers
    often do), every launcher and worker a test starts would otherwise compile it from source
    again (~0.3 s of CPU each; Python still reads bytecode that exists). Up-to-date files are
    skipped; ``__pycache__`` is ignored by git, as after any ordinary import."""
    for package in ("determined_launch", "wrap_rank"):
        compileall.compile_dir(str(REPO / package), quiet=2)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Let pytest keep its assertion-rewritten test modules (tests/__pycache__, ignored by
    git) even under PYTHONDONTWRITEBYTECODE: rewriting all of them again costs ~5 s of CPU
    per run. Only while collecting, so no test's own imports leave ``__pycache__`` behind."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = before


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path_factory: pytest.TempPathFactory,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs in a fresh, empty working directory. A job writes its default run
    directory (``./det_runs/...``) and experiments (``./det_experiments``) where it runs:
    from the repository root, tests left them there and, worse, one test's job shared its
    run directory (checkpoints, leases, claims) with another test's job of the same command.
    Both simulated nodes of one test still share it, as nodes share a file system. Not
    ``tmp_path``: tests check what their jobs leave there."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(LAUNCH_TMP, ignore_errors=True)


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = LAUNCH_TMP
    # Keep gloo to loopback; keep CPU threads low on a 2-core machine.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    # Run as on a plain machine even inside a scheduler's job: no detector
    # but the one a test asks for may match.
    scheduler_prefixes = ("SLURM_", "OMPI_", "PMI_", "LSB_", "PBS_", "TORCHELASTIC_", "DET_")
    for var in list(env):
        if var.startswith(scheduler_prefixes) or var in (
            "C10D_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "JOB_COMPLETION_INDEX"
        ):
            del env[var]
    # The suite's launched jobs check exact CPU math; on a machine with GPUs
    # they stay on CPU (a 2-rank job on 1 GPU cannot run NCCL) unless a test
    # asks for GPUs (tests/test_gpu.py). No change on a machine without any.
    if glob.glob("/dev/nvidia[0-9]*"):
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def write_cluster_info(path: Path, **fields: Any) -> Path:
    path.write_text(json.dumps(fields))
    return path


def leftover_processes(marker: str) -> list[psutil.Process]:
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER) == marker and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except (psutil.Error, OSError):
            continue
    return left


class Launch:
    """A launcher subprocess with a unique marker, for leak checks."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.marker = uuid.uuid4().hex
        env = dict(env)
        env[MARKER] = self.marker
        self.proc = subprocess.Popen(
            list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stdout = ""
        self.stderr = ""
        #: whether the test read its output (``wait``); else the fixture shows it
        self.collected = False

    def wait(self, timeout: float) -> int:
        self.collected = True
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()
            raise AssertionError(
                f"launcher did not exit within {timeout}s\nstdout:\n{self.stdout}\n"
                f"stderr:\n{self.stderr}"
            ) from None
        return self.proc.returncode

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def leftovers(self, settle: float = 2.0) -> list[psutil.Process]:
        deadline = time.monotonic() + settle
        left = leftover_processes(self.marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = leftover_processes(self.marker)
        return left

    def kill_leftovers(self) -> None:
        for p in leftover_processes(self.marker):
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    """Collects launchers; anything left after the test is killed (and the
    test that leaked it has already failed on its own leak assertion)."""
    started: list[Launch] = []
    yield started
    for launch in started:
        if not launch.collected:
            # A test that failed on one launcher (node 1 waiting, say) is explained by the
            # other's output, even one that exited long ago: pytest shows this with the failure.
            running = launch.proc.poll() is None
            if running:
                launch.proc.kill()
            launch.kill_leftovers()  # they would hold its pipes open
            try:
                out, err = launch.proc.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError, OSError):
                out, err = "", "(its output could not be read)"
            print(f"launcher {launch.marker} ({'was still running' if running else 'had exited'}, "
                  f"status {launch.proc.returncode}); stderr tail:\n{err[-4000:]}\n"
                  f"stdout tail:\n{out[-2000:]}")
        launch.kill_leftovers()


def launcher_cmd(*args: str, module: str = "determined_launch.torch_distributed") -> list[str]:
    return [sys.executable, "-m", module, *args]


def exec_on_two_nodes(tmp_path: Path, command: Sequence[str], launches: list[Launch], *,
                      launcher_flags: Sequence[str] = (), **extra: str) -> list[Launch]:
    """``det-launch [launcher_flags] exec -- command`` as two simulated nodes on loopback
    (one cluster-info file each, one secret), started and registered for cleanup."""
    port = free_port_block()
    nodes = []
    for rank in (0, 1):
        path = write_cluster_info(
            tmp_path / f"node{rank}.json", container_addrs=["127.0.0.1", "127.0.0.1"],
            container_rank=rank, container_slot_counts=[1, 1])
        env = base_env(DET_CLUSTER_INFO_FILE=str(path), C10D_PORT=str(port),
                       DET_DIST_SECRET="e" * 32, DET_KILL_AFTER="3", **extra)
        argv = [sys.executable, "-m", "determined_launch.cli", *launcher_flags, "exec", "--",
                *command]
        nodes.append(Launch(argv, env))
    launches.extend(nodes)
    return nodes


def wait_for_file(path: Path, timeout: float, what: Optional[str] = None) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or path} did not appear within {timeout}s")
        time.sleep(0.05)


# The storage servers (moto's S3, azurite) as session fixtures, registered here once so every
# test module shares one server per session. Imported last: storage_servers uses the helpers above.
from tests.storage_servers import azurite, fault_proxy, s3_server  # noqa: E402, F401
