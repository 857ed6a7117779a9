"""The Core API tutorials in examples/core_api/, run as their README says.

The tutorials' "training step" is ``time.sleep(0.1)``; tests/_example_site
scales it (``EXAMPLE_TIME_SCALE``) so the unchanged scripts run faster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from determined_launch.core._rundir import read_jsonl
from tests._core_helpers import (
    PREEMPT_GRACE,
    common_stop,
    preempt_through_non_chief,
    start_two_nodes,
)
from tests.conftest import REPO, Launch, base_env, wait_for_file

pytestmark = pytest.mark.slow
EXAMPLES = REPO / "examples" / "core_api"
SITE = Path(__file__).resolve().parent / "_example_site"


def example_env(scale: float, **extra: str) -> dict[str, str]:
    env = base_env(EXAMPLE_TIME_SCALE=str(scale))
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), env["PYTHONPATH"]])
    for var in ("DET_RUN_DIR", "DET_CHECKPOINT_STORAGE", "DET_PREEMPT_FILE"):
        env.pop(var, None)
    env.update(extra)
    return env


def run_example(name: str, cwd: Path, scale: float = 0.02, **extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=cwd,
        env=example_env(scale, DET_CLUSTER_INFO_FILE=str(EXAMPLES / "trial.json"), **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def steps(path: Path) -> list[int]:
    return [r["steps_completed"] for r in read_jsonl(path)]


def test_tutorial_steps_0_to_3(tmp_path: Path) -> None:
    out = run_example("0_start.py", tmp_path)
    assert "x is now 100" in out

    run = tmp_path / "det_runs" / "trial-1"
    (tmp_path / "m").mkdir()
    run_example("1_metrics.py", tmp_path / "m")
    metrics_run = tmp_path / "m" / "det_runs" / "trial-1"
    assert steps(metrics_run / "training.jsonl") == list(range(10, 101, 10))
    assert read_jsonl(metrics_run / "validation.jsonl")[0]["metrics"] == {"x": 100}

    run_example("2_checkpoints.py", tmp_path)
    assert read_jsonl(run / "validation.jsonl")[-1]["metrics"] == {"x": 100}
    assert len(os.listdir(tmp_path / "det_runs" / "checkpoints")) == 10

    # 3_hpsearch, same trial but another command: its own run (rundir.py), which
    # does not resume 2_checkpoints' checkpoint at step 100 but trains to op.length.
    out = run_example("3_hpsearch.py", tmp_path)
    assert "at batch 100" not in out
    (own,) = (tmp_path / "det_runs").glob("trial-1-3_hpsearch-*")
    assert read_jsonl(own / "searcher.jsonl")[-1]["searcher_metric"] == 100
    assert not (run / "searcher.jsonl").exists()


def test_preemption_file_pauses_and_a_rerun_resumes(tmp_path: Path) -> None:
    """2_checkpoints without a launcher: the operator's DET_PREEMPT_FILE."""
    stop = tmp_path / "stop"
    run = tmp_path / "det_runs" / "trial-1"
    env = example_env(
        0.2, DET_CLUSTER_INFO_FILE=str(EXAMPLES / "trial.json"), DET_PREEMPT_FILE=str(stop)
    )
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "2_checkpoints.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_file(run / "training.jsonl", 60)
        stop.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    first = steps(run / "training.jsonl")
    stopped = first[-1]
    assert f"preempted after {stopped} steps" in out
    assert stopped < 100 and not (run / "validation.jsonl").exists()

    stop.unlink()
    out = run_example("2_checkpoints.py", tmp_path)
    assert f"at batch {stopped}" in out
    assert steps(run / "training.jsonl") == list(range(10, 101, 10))
    assert read_jsonl(run / "validation.jsonl")[0]["metrics"] == {"x": 100}


def start_example_nodes(launches: list[Launch]) -> list[Launch]:
    """examples/core_api/4_distributed.py as two_nodes.sh runs it."""
    argv = [sys.executable, str(EXAMPLES / "4_distributed.py"), "launcher"]
    return start_two_nodes(argv, example_env(0.5, DET_PREEMPT_GRACE=str(PREEMPT_GRACE)), launches)


def test_4_distributed_pause_on_non_chief_node_then_resume(
    tmp_path: Path, launches: list[Launch], monkeypatch: Any
) -> None:
    """A signal to node 1's launcher: all 4 ranks stop after the same step,
    the chief's checkpoint is at that step, both launchers exit 75 within
    the grace period; rerunning the same command continues from there."""
    monkeypatch.chdir(tmp_path)  # Launch inherits the cwd: det_runs/ goes here
    run = tmp_path / "det_runs" / "trial-4"
    chief, other = start_example_nodes(launches)
    preempt_through_non_chief(chief, other, run / "training.jsonl")
    pattern = r"\[rank=(\d)\].*preempted after (\d+) "
    stopped = common_stop(pattern, chief.stderr + other.stderr)
    assert steps(run / "training.jsonl")[-1] == stopped < 100
    pointer = read_jsonl(run / "latest_checkpoint.json")[0]
    assert pointer["metadata"] == {"steps_completed": stopped}

    chief, other = start_example_nodes(launches)
    assert [other.wait(90), chief.wait(90)] == [0, 0], chief.stderr + other.stderr
    assert f"{pointer['storage_id']} at batch {stopped}" in chief.stderr
    assert steps(run / "training.jsonl") == list(range(10, 101, 10))
    # x grows by 4 per step (4 ranks x increment_by 1) across both runs
    assert read_jsonl(run / "validation.jsonl")[0]["metrics"] == {"x": 400}
    assert read_jsonl(run / "searcher.jsonl")[0]["searcher_metric"] == 400
