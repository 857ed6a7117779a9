"""A SLURM job array of `det-launch experiment --worker` tasks sharing one study
(the real SLURM fixture of tests/slurm_cluster.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import base_env
from tests.slurm_cluster import SlurmCluster, slurm_cluster
from tests.test_search import SCRIPT, batches, trial_dirs, write_config

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
