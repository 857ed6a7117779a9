"""End to end on a real two-node SLURM cluster (tests/slurm_cluster.py): the
launcher runs in srun steps with no cluster-info file.

The emulated nodes n1 and n2 share this machine but have different
addresses (NodeAddr 127.0.0.1 and 127.0.0.2), which the launcher learns from
SLURM's variables and ``scontrol``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, WORKERS, base_env, free_port_block, wait_for_file
from tests.slurm_cluster import SlurmCluster, slurm_cluster

__all__ = ["slurm_cluster"]  # the fixture, imported for pytest

pytestmark = pytest.mark.slow
LAUNCH = [sys.executable, "-m", "determined_launch.torch_distributed"]
ALLREDUCE = [sys.executable, str(WORKERS / "allreduce.py")]


def job_env(**extra: str) -> dict[str, str]:
    """What every task needs: this checkout, a free master port block and a
    shared job secret (srun exports the submitting environment)."""
    return base_env(
        C10D_PORT=str(free_port_block()), DET_DIST_SECRET="slurm-e2e-" + "k" * 22, **extra
    )


def results(out: str) -> dict[int, tuple[int, int, str]]:
    """rank -> (world, sum, chief) from allreduce.py's lines."""
    found = re.findall(r"world=(\d+) rank=(\d+) sum=(\d+) chief=(\S+)", out)
    return {int(r): (int(w), int(s), c) for w, r, s, c in found}


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    slurm_cluster.wait_idle()
    return slurm_cluster


def test_cluster_runs_a_two_node_step(cluster: SlurmCluster) -> None:
    r = cluster.run(
        ["srun", "-N2", "--ntasks-per-node=2", "bash", "-c", "echo $SLURMD_NODENAME $SLURM_PROCID"]
    )
    assert r.returncode == 0, r.stderr + cluster.logs()
    assert sorted(r.stdout.split("\n")[:-1]) == ["n1 0", "n1 1", "n2 2", "n2 3"]


def test_info_inside_srun_explains_the_detection(cluster: SlurmCluster) -> None:
    r = cluster.run(
        [
            "srun",
            "-N2",
            "--ntasks-per-node=1",
            "--label",
            sys.executable,
            "-m",
            "determined_launch.cli",
            "info",
        ],
        env=base_env(),
    )
    assert r.returncode == 0, r.stderr
    by_task = {int(t): line for t, line in re.findall(r"^(\d+): (.*)$", r.stdout, re.M)}
    assert by_task  # --label prefixes every line with the task id
    docs = {}
    for task in (0, 1):
        text = "\n".join(
            line.split(": ", 1)[1] for line in r.stdout.splitlines() if line.startswith(f"{task}: ")
        )
        docs[task] = json.loads(text)
    for task, doc in docs.items():
        assert doc["detector"] == "slurm"
        assert doc["cluster_info"]["container_addrs"] == ["127.0.0.1", "127.0.0.2"]
        assert doc["cluster_info"]["container_rank"] == task
        assert [s["detector"] for s in doc["skipped"]][:4] == [
            "file",
            "determined",
            "torchrun",
            "mpi",
        ]


def test_one_launcher_per_node_forms_one_world(cluster: SlurmCluster) -> None:
    """srun -N2 --ntasks-per-node=1 python -m determined_launch.torch_distributed:
    2 nodes x 2 slots, one gloo world of 4."""
    r = cluster.run(
        ["srun", "-N2", "--ntasks-per-node=1", *LAUNCH, *ALLREDUCE],
        env=job_env(DET_LAUNCH_SLOTS="2"),
        timeout=150,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert results(r.stdout) == {rank: (4, 10, "127.0.0.1") for rank in range(4)}


def test_example_sbatch_one_task_per_slot(cluster: SlurmCluster, tmp_path: Path) -> None:
    """examples/slurm/cpu_per_task.sbatch, sized down to this cluster: plain
    `srun` in a two-node batch job of 3 tasks (SLURM_TASKS_PER_NODE=2,1)
    starts 3 launchers, each a one-slot node, so the world is the job's 3
    tasks, not 3 x 2."""
    (tmp_path / "train.py").symlink_to(WORKERS / "allreduce.py")
    r = cluster.run(
        ["sbatch", "--wait", "--ntasks=3", "--ntasks-per-node=2", "--cpus-per-task=1",
         f"--chdir={tmp_path}", str(REPO / "examples" / "slurm" / "cpu_per_task.sbatch")],
        env=job_env(),
        timeout=150,
    )  # fmt: skip
    logs = "".join(p.read_text() for p in tmp_path.glob("det-launch-cpu-*.out"))
    assert r.returncode == 0, r.stderr + logs
    assert results(logs) == {rank: (3, 6, "127.0.0.1") for rank in range(3)}


DIST_WORKER = """
import os
from determined_launch.core import DistributedContext
with DistributedContext.from_env() as ctx:
    seen = ctx.allgather((ctx.get_rank(), os.environ["SLURMD_NODENAME"]))
    print("dist", ctx.get_rank(), ctx.get_size(), ctx.get_cross_rank(), sorted(seen), flush=True)
"""


def test_distributed_context_from_env_in_an_srun_step(cluster: SlurmCluster) -> None:
    """Workers started by the launcher in an srun step find each other with
    DistributedContext.from_env(): one allgather across both nodes."""
    pytest.importorskip(
        "determined_launch.core.distributed", reason="DistributedContext not merged"
    )
    r = cluster.run(
        ["srun", "-N2", "--ntasks-per-node=1", *LAUNCH, sys.executable, "-c", DIST_WORKER],
        env=job_env(DET_LAUNCH_SLOTS="2"),
        timeout=150,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(re.findall(r"dist (\d) 4 (\d) (.*)$", r.stdout, re.M))
    everyone = str([(0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")])
    assert lines == [("0", "0", everyone), ("1", "0", everyone), ("2", "1", everyone),
                     ("3", "1", everyone)]  # fmt: skip


def test_a_failing_rank_ends_the_whole_step(cluster: SlurmCluster) -> None:
    """Rank 1 (on n2) exits 3 while rank 0 waits in a collective: the step
    ends with status 3 well before any gloo timeout, nothing left running."""
    start = time.monotonic()
    r = cluster.run(
        ["srun", "-N2", "--ntasks-per-node=1", *LAUNCH, *ALLREDUCE],
        env=job_env(FAIL_RANK="1", FAIL_CODE="3", DET_KILL_AFTER="3"),
        timeout=150,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert time.monotonic() - start < 60
    assert "rank 1 on node 1 (127.0.0.2) exited with status 3 first" in r.stderr, r.stderr
    left = subprocess.run(["pgrep", "-f", str(WORKERS / "allreduce.py")], capture_output=True)
    assert left.stdout == b""


def test_scancel_signal_preempts_every_node(cluster: SlurmCluster, tmp_path: Path) -> None:
    """``scancel --signal=USR1`` (what ``--signal=USR1@secs`` sends before the
    time limit) reaches the launcher's preemption path on both nodes: the
    workers see the preemption file, acknowledge, and the step ends 75."""
    ready = tmp_path / "ready"
    ready.mkdir()
    worker = [sys.executable, str(WORKERS / "preempt_poll.py")]
    proc = subprocess.Popen(
        ["srun", "-N2", "--ntasks-per-node=1", "--job-name=preempt-e2e", *LAUNCH, *worker],
        env={**cluster.env, **job_env(READY_DIR=str(ready))},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for rank in (0, 1):
            wait_for_file(ready / f"rank-{rank}", 120, f"rank {rank}")
        time.sleep(0.5)  # both launchers are past their control-channel handshake
        job = cluster.run(["squeue", "--noheader", "--name=preempt-e2e", "--format=%i"])
        job_id = job.stdout.split()[0]
        sent = time.time()
        r = cluster.run(["scancel", "--signal=USR1", job_id])
        assert r.returncode == 0, r.stderr
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 75, out + err
    seen = [float((ready / f"seen-{r}").read_text()) for r in (0, 1)]
    assert max(seen) - sent < 2.0, seen
    assert err.count("job preempted after the workers acknowledged") == 2, err


def test_requeue_after_acknowledged_preemption(cluster: SlurmCluster, tmp_path: Path) -> None:
    """``DET_LAUNCH_REQUEUE=1``: after the workers acknowledge a USR1
    preemption, the chief's launcher runs ``scontrol requeue`` and SLURM
    counts a restart of the batch job."""
    ready = tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "job.sbatch"
    worker = " ".join([sys.executable, str(WORKERS / "preempt_poll.py")])
    script.write_text(
        "#!/bin/bash\n"
        f"srun --ntasks=2 --ntasks-per-node=1 {' '.join(LAUNCH)} {worker}\n"
    )
    env = job_env(READY_DIR=str(ready), DET_LAUNCH_REQUEUE="1", DET_PREEMPT_SIGNALS="USR1")
    r = cluster.run(
        ["sbatch", "--parsable", "-N2", "--requeue", f"--output={tmp_path}/out-%j.txt",
         str(script)],
        env=env,
        cwd=str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    try:
        for rank in (0, 1):
            wait_for_file(ready / f"rank-{rank}", 120, f"rank {rank}")
        time.sleep(0.5)
        assert cluster.run(["scancel", "--signal=USR1", job_id]).returncode == 0
        deadline = time.monotonic() + 60
        shown = ""
        while time.monotonic() < deadline:
            shown = cluster.run(["scontrol", "show", "job", job_id]).stdout
            if "Restarts=1" in shown:
                break
            time.sleep(0.5)
        assert "Restarts=1" in shown, shown + cluster.logs()
        out = (tmp_path / f"out-{job_id}.txt").read_text()
        assert f"det-launch: requeueing SLURM job {job_id}" in out, out
        # Requeueing ends the batch script and the step at once, so the chief's
        # summary (printed before it requeues) is the record of the status;
        # node 1's may or may not make it out first.
        assert "job preempted after the workers acknowledged; resumable" in out, out
    finally:
        cluster.run(["scancel", job_id])
