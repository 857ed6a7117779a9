"""`det` end to end: real detached experiments of tests/search/trial_script.py
(Core API, no torch) in a real experiments root, a real `det job run`, and
`det e create --slurm` on the suite's real SLURM cluster."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, base_env
from tests.slurm_cluster import SlurmCluster, slurm_cluster

__all__ = ["slurm_cluster"]  # the fixture, imported for pytest

pytest.importorskip("optuna", reason="the [search] extra is not installed")
pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "search" / "trial_script.py"


def project(tmp: Path, searcher: dict[str, Any], **hparams: Any) -> Path:
    """A user's directory: train.py and const.yaml (entrypoint relative to it)."""
    proj = tmp / "proj"
    proj.mkdir()
    shutil.copy(SCRIPT, proj / "train.py")
    (proj / "notes.log").write_text("left out by .detignore")
    (proj / ".detignore").write_text("*.log\n")
    doc = {"name": "const", "entrypoint": "python3 train.py", "max_restarts": 0,
           "hyperparameters": {"layers": 2, "period": 4, "ckpt_every": 4, **hparams},
           "searcher": {"metric": "loss", "max_length": 8, **searcher}}
    (proj / "const.yaml").write_text(json.dumps(doc))
    return proj


def det(proj: Path, *args: str, timeout: float = 60, env: Any = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "determined_launch.det", *args],
                          cwd=proj, env=env or base_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))[1:]


def test_create_detached_then_inspect_and_follow(tmp_path: Path) -> None:
    proj = project(tmp_path, {"name": "random", "max_trials": 2, "max_concurrent_trials": 2},
                   x={"type": "double", "minval": 0, "maxval": 1}, sleep=0.05)
    t0 = time.monotonic()
    out = ok(det(proj, "e", "create", "const.yaml", "."))
    assert out == "Created experiment 1\n" and time.monotonic() - t0 < 10
    (proj / "train.py").unlink()  # the trials run the experiment's copy
    exp = proj / "det_experiments" / "const"
    driver = json.loads((exp / "det_driver.json").read_text())
    assert os.getsid(driver["pid"]) == driver["pid"]  # its own session: survives the terminal
    assert csv_rows(ok(det(proj, "e", "list", "--csv")))[0][4] in ("ACTIVE", "COMPLETED")
    assert ok(det(proj, "e", "wait", "1", "--polling-interval", "0.2")) == ""
    row = csv_rows(ok(det(proj, "e", "list", "--csv")))[0]
    assert row[:3] == ["1", row[1], "const"] and row[4:6] == ["COMPLETED", "100.0%"]
    trials = csv_rows(ok(det(proj, "e", "list-trials", "1", "--csv")))
    assert [(t[0], t[1]) for t in trials] == [("1", "COMPLETED"), ("2", "COMPLETED")]
    described = json.loads(ok(det(proj, "e", "describe", "const", "--json")))
    assert [t["totalBatchesProcessed"] for t in described[0]["trials"]] == [8, 8]
    assert sorted(p.name for p in (exp / "context").iterdir()) == ["const.yaml", "train.py"]
    assert "job succeeded" in ok(det(proj, "t", "logs", "2", "--tail", "3"))
    ckpts = csv_rows(ok(det(proj, "c", "list", "1", "--csv")))
    assert len(ckpts) == 4 and {c[0] for c in ckpts} == {"1", "2"}
    got = ok(det(proj, "c", "download", ckpts[0][4], "-o", str(tmp_path / "dl"), "-q"))
    assert got.strip() == str(tmp_path / "dl") and (tmp_path / "dl" / "state.json").is_file()
    # -f follows the first trial; ids go on across the root (experiment 2, trial 3)
    shutil.copy(SCRIPT, proj / "train.py")
    r = det(proj, "e", "create", "const.yaml", ".", "-f", "--config", "searcher.max_trials=1")
    assert ok(r).splitlines()[:3] == ["Created experiment 2", "Waiting for first trial to begin...",
                                      "Following first trial with ID 3"], r.stdout
    assert r.stdout.splitlines()[-1] == ("Trial log stream ended. To reopen log stream, run: "
                                         "det trial logs -f 3")
    assert (proj / "det_experiments" / "const-2" / "trials" / "3").is_dir()


def test_pause_activate_kill(tmp_path: Path) -> None:
    proj = project(tmp_path, {"name": "single", "max_length": 400}, x=0.7, sleep=0.02)
    ok(det(proj, "e", "create", "const.yaml", "."))
    exp = proj / "det_experiments" / "const"
    deadline = time.monotonic() + 30
    while not (exp / "trials" / "1" / "validation.jsonl").exists():
        assert time.monotonic() < deadline, (exp / "experiment.log").read_text()
        time.sleep(0.1)
    assert ok(det(proj, "e", "pause", "1")) == "Paused experiment 1\n"
    deadline = time.monotonic() + 30
    while (state := csv_rows(ok(det(proj, "e", "list", "--csv")))[0][4]) != "PAUSED":
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    trial = exp / "trials" / "1"
    assert (trial / "checkpoints.jsonl").is_file()  # it checkpointed on the way out
    assert ok(det(proj, "e", "activate", "1")) == "Activated experiment 1\n"
    deadline = time.monotonic() + 30
    while json.loads((trial / "cluster_info.json").read_text())["latest_checkpoint"] is None:
        assert time.monotonic() < deadline, (exp / "experiment.log").read_text()
        time.sleep(0.2)
    assert ok(det(proj, "e", "kill", "1")) == "Killed experiment 1\n"
    assert det(proj, "e", "wait", "1", "--polling-interval", "0.2", timeout=30).returncode == 1
    assert csv_rows(ok(det(proj, "e", "list", "--csv")))[0][4] == "CANCELED"


def test_job_run_gives_the_config_data_to_the_job(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "job.yaml").write_text(json.dumps({
        "entrypoint_script": "python3 job.py", "data": {"trial_id": 3, "batch_size": 64}}))
    (proj / "job.py").write_text(
        "import json, os\n"
        "conf = json.load(open(os.environ['DET_LAUNCH_CONFIG']))\n"
        "print('DATA', json.dumps(conf['data']), os.path.basename(os.getcwd()))\n")
    r = det(proj, "job", "run", "job.yaml", ".")
    assert ok(r).splitlines()[0].startswith("Launched job 1 (")
    assert 'DATA {"trial_id": 3, "batch_size": 64} context' in r.stdout


def test_create_slurm_submits_the_workers_as_an_array(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    slurm_cluster.wait_idle()
    proj = project(tmp_path, {"name": "random", "max_trials": 4, "max_concurrent_trials": 2},
                   x={"type": "double", "minval": 0, "maxval": 1}, period=2, sleep=0.05)
    env = {**base_env(), "SLURM_CONF": slurm_cluster.env["SLURM_CONF"]}
    r = det(proj, "e", "create", "const.yaml", ".", "--slurm", "--cpus-per-task=1", env=env)
    lines = ok(r).splitlines()
    assert lines[0] == "Created experiment 1" and lines[1].startswith("Submitted SLURM job ")
    seen = set()
    deadline = time.monotonic() + 120
    while (state := csv_rows(ok(det(proj, "e", "list", "--csv", env=env)))[0])[4] != "COMPLETED":
        seen.add((state[4], state[8]))
        assert time.monotonic() < deadline, (seen, slurm_cluster.logs())
        time.sleep(0.3)
    assert seen & {("QUEUED", "slurm"), ("RUNNING", "slurm")}, seen  # shown while SLURM runs it
    exp = proj / "det_experiments" / "const"
    outs = sorted(p.name for p in exp.glob("slurm-*.out"))
    assert len(outs) == 2, outs  # max_concurrent_trials workers
    trials = csv_rows(ok(det(proj, "e", "lt", "1", "--csv", env=env)))
    assert [t[1] for t in trials] == ["COMPLETED"] * 4
