"""A SLURM job array of `det-launch experiment --worker` tasks sharing one study
(the real SLURM fixture of tests/slurm_cluster.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import base_env, free_port_block
from tests.slurm_cluster import SlurmCluster, slurm_cluster
from tests.test_search import EXEC, SCRIPT, batches, trial_dirs, write_config

__all__ = ["slurm_cluster"]  # the fixture, imported for pytest

pytest.importorskip("optuna", reason="the [search] extra is not installed")
pytestmark = pytest.mark.slow

ARRAY_SCRIPT = """#!/bin/bash
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
# One worker per array task; every worker takes trials from the same study.
exec {python} -m determined_launch.cli experiment {config} --worker \\
    --experiment-dir {exp} --study-storage {journal} \\
    exec -- {python} {script}
"""


def test_a_three_task_array_of_workers_runs_each_trial_once(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    slurm_cluster.wait_idle()
    cfg = write_config(tmp_path, {"x": {"type": "double", "minval": 0, "maxval": 1},
                                  "layers": 2, "period": 2, "sleep": 0.02},
                       {"name": "random", "metric": "loss", "max_trials": 6,
                        "max_length": 10}, name="array")
    exp = tmp_path / "exp"
    batch = tmp_path / "workers.sbatch"
    batch.write_text(ARRAY_SCRIPT.format(python=sys.executable, config=cfg, exp=exp,
                                         journal=tmp_path / "study.journal", script=SCRIPT))
    r = slurm_cluster.run(["sbatch", "--wait", "--array=0-2", f"--chdir={tmp_path}",
                           "--output=worker-%a.out", str(batch)], env=base_env(), timeout=120)
    logs = {p.name: p.read_text() for p in tmp_path.glob("worker-*.out")}
    assert r.returncode == 0, r.stderr + str(logs) + slurm_cluster.logs()
    assert sorted(logs) == ["worker-0.out", "worker-1.out", "worker-2.out"]
    dirs = trial_dirs(exp)
    assert sorted(dirs) == [1, 2, 3, 4, 5, 6]
    assert all(batches(d) == 10 for d in dirs.values())  # each trial ran exactly once
    started = [line for text in logs.values() for line in text.splitlines()
               if ": started" in line]
    assert len(started) == 6, logs
    assert sum(1 for text in logs.values() if ": started" in text) >= 2, logs  # shared work


def test_a_trial_across_both_nodes_of_an_srun_step(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """srun -N2: one worker per SLURM node, resources.slots_per_trial 2 over two
    one-slot nodes, so the trial is one launcher job across both (experiment/gang.py)."""
    slurm_cluster.wait_idle()
    cfg = write_config(tmp_path, {"x": 0.7, "layers": 2, "period": 2},
                       {"name": "single", "metric": "loss", "max_length": 4}, name="gang",
                       resources={"slots_per_trial": 2})
    exp = tmp_path / "exp"
    env = base_env(C10D_PORT=str(free_port_block(4)), DET_DIST_SECRET="gang-" + "k" * 27,
                   DET_LAUNCH_SLOTS="1")
    r = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=1", f"--chdir={tmp_path}",
                           sys.executable, "-m", "determined_launch.cli", "experiment", str(cfg),
                           "--worker", "--experiment-dir", str(exp), "--study-storage",
                           str(tmp_path / "study.journal"), *EXEC], env=env, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr + slurm_cluster.logs()
    trial = trial_dirs(exp)[1]
    info = json.loads((trial / "cluster_info.json").read_text())
    assert info["container_addrs"] == ["127.0.0.1", "127.0.0.2"], info
    reports = [json.loads(line) for line in (trial / "validation.jsonl").read_text().splitlines()]
    assert [m["metrics"]["world_size"] for m in reports] == [2, 2]
    assert (trial / "node1" / "ranks.log").read_text().split() == ["1/2"]
    assert "trial 1: completed" in r.stdout and batches(trial) == 4
