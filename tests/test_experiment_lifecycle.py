"""The experiment lifecycle a new user meets (issue 33 §2 items 1, 2, 5, 9, 10):
a trial without the searcher's metric completes, a rerun retries failed trials
from their checkpoints, a failed distributed trial shows the first failure,
trials run at once when the node has the slots, and the stop line and the
table agree. Pure parts first; then real experiments of a tiny Core API script."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from determined_launch import expconf
from determined_launch.experiment import concurrency, owners, report
from determined_launch.experiment.trial import Report, TrialProcess, TrialSpec, failure_tail
from tests.conftest import base_env

optuna = pytest.importorskip("optuna", reason="the [search] extra is not installed")

SUMMARY = ("det-launch: job failed: rank 0 on node 0 (127.0.0.1) exited with status 7 first "
           "(2 ranks failed); exit status 7")


def test_a_failed_runs_tail_is_the_first_failing_ranks() -> None:
    # The issue's log: rank 0 failed; rank 1's teardown ("lost the connection") came last.
    log = "\n".join([
        "[rank=1] step 1", "[rank=0] step 1", "[rank=0] RuntimeError: the genuine error",
        *[f"[rank=1]   File \"member.py\", line {n}" for n in range(20)],
        "[rank=1] DistributedError: lost the connection to rank 0 (the chief)", SUMMARY, ""])
    tail = failure_tail(log, 8).splitlines()
    assert tail == ["[rank=0] step 1", "[rank=0] RuntimeError: the genuine error", SUMMARY]
    assert "lost the connection" not in failure_tail(log, 8)
    # no summary naming a rank (one process, or a lost node): the last lines
    plain_log = "a\nb\nc\ndet-launch: job failed: the command on node 0 exited with status 1"
    assert failure_tail(plain_log, 2).splitlines() == [
        "c", "det-launch: job failed: the command on node 0 exited with status 1"]
    # the failing rank wrote elsewhere (another node's log): the last lines too
    other = log.replace("[rank=0]", "[rank=2]")
    assert failure_tail(other, 2).splitlines()[-1] == SUMMARY
    assert "lost the connection" in failure_tail(other, 2)


def test_default_concurrency_fills_the_nodes_slots() -> None:
    assert concurrency.default_concurrency(0, 8, 1) == 8  # Determined: one slot per trial
    assert concurrency.default_concurrency(0, 64, 1) == 16  # Determined's default limit
    assert concurrency.default_concurrency(4, 8, 1) == 4
    assert concurrency.default_concurrency(0, 8, 3) == 2
    assert concurrency.default_concurrency(0, 1, 8) == 1  # an oversubscribed trial still runs
    gpus = [str(i) for i in range(8)]
    assert concurrency.gpu_groups(gpus, 2, 4) == ["0,1", "2,3", "4,5", "6,7"]
    assert concurrency.gpu_groups(gpus, 1, 1) == []  # one at a time: it sees them all
    assert concurrency.gpu_groups(["0"], 1, 2) == []  # nothing to split
    assert concurrency.visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}) == ["3", "5"]
    assert concurrency.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    unset = {"searcher": {"name": "random", "metric": "x", "max_trials": 2}}
    assert expconf.parse(unset, pathlib.Path("e.yaml")).searcher.max_concurrent_trials == 0
    unset["searcher"]["max_concurrent_trials"] = 3
    assert expconf.parse(unset, pathlib.Path("e.yaml")).searcher.max_concurrent_trials == 3


def _trial(number: int, **attrs: Any) -> Any:
    t = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs=attrs)
    t.number = number
    return t


def test_a_failed_trial_stays_open_for_a_rerun_to_retry() -> None:
    now = time.time()
    failed = _trial(0, det_failed=True, det_owner="", det_error="exit status 3")
    paused = _trial(1, det_owner="")
    assert report.state_of(failed, now) == "failed" and owners.is_failed(failed)
    assert report.state_of(paused, now) == "paused" and not owners.is_failed(paused)
    assert owners.to_retry([failed, paused], now) == [0]
    # another process still runs a trial: a late worker retries nothing
    live = _trial(2, det_owner=owners.owner_id(), det_heartbeat=now)
    assert owners.to_retry([failed, paused, live], now) == []
    # invalid hparams are not a failure
    invalid = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL,
                                        user_attrs={"det_invalid_hp": True, "det_error": "x"})
    assert not owners.is_failed(invalid)


def test_a_trial_without_the_metric_has_no_best_value() -> None:
    t = optuna.trial.create_trial(value=float("inf"), user_attrs={"det_no_metric": True})
    assert report.best_value(t, smaller=True) is None
    assert report.best_trial([t], smaller=True) is None


def test_the_stop_line_and_the_table_agree_on_the_length(tmp_path: pathlib.Path) -> None:
    proc = TrialProcess(TrialSpec(number=2, hparams={}, seed=0, experiment_id=1, max_length=64),
                        tmp_path, "loss", None)
    # ASHA stopped it at its validation at 16; it trained on to 18 before the stop took.
    (proc.dir / "validation.jsonl").write_text(json.dumps(
        {"steps_completed": 16, "metrics": {"loss": 0.35}}) + "\n")
    (proc.dir / "training.jsonl").write_text(json.dumps(
        {"steps_completed": 18, "metrics": {"loss": 0.3}}) + "\n")
    proc.stopped_at = Report(16, 0.35)
    line = report.stopped_line(proc, "loss")
    assert line == "trial 3: stopped by ASHA at length 16 (loss=0.35); it stopped after 18 steps"
    assert report.progress_of(proc.dir) == "18"  # the table's steps


# -- end to end: real experiments ------------------------------------------------------

SCRIPT = '''
import json, pathlib, time
import determined_launch as det
from determined_launch import core

info = det.get_cluster_info()
hp = info.trial.hparams
with core.init() as ctx:
    step = 0
    if info.latest_checkpoint:
        with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
            step = json.loads((pathlib.Path(path) / "s.json").read_text())["step"]
        print("resumed at", step, flush=True)
    while step < 6:
        step += 1
        time.sleep(hp["sleep"])
        ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1 / step})
        if step == 3:
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                (pathlib.Path(path) / "s.json").write_text(json.dumps({"step": step}))
        if step == 4 and pathlib.Path(hp["bug"]).exists():
            raise SystemExit(3)
    if hp["validate"]:
        ctx.train.report_validation_metrics(steps_completed=step, metrics={"loss": 1 / step})
'''


def _experiment(tmp: pathlib.Path, name: str, hparams: dict[str, Any],
                searcher: dict[str, Any], **env: str) -> subprocess.CompletedProcess[str]:
    (tmp / "train.py").write_text(SCRIPT)
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(json.dumps({"name": name, "hyperparameters": hparams, "max_restarts": 0,
                               "searcher": {"metric": "loss", **searcher},
                               "entrypoint": f"{sys.executable} train.py"}))
    return subprocess.run([sys.executable, "-m", "determined_launch.cli", "experiment",
                           str(cfg)], env=base_env(**env), capture_output=True, text=True,
                          timeout=90, check=False, cwd=tmp)


@pytest.mark.slow
def test_no_metric_completes_trials_run_at_once_and_a_rerun_retries(tmp_path: pathlib.Path
                                                                    ) -> None:
    bug = tmp_path / "BUG"
    # Items 1 and 9: no validation metric at all (tutorial 0), two slots on this node.
    r = _experiment(tmp_path, "nometric", {"case": {"type": "categorical", "vals": [1, 2]},
                                           "sleep": 0.05, "bug": str(bug), "validate": False},
                    {"name": "grid"}, DET_LAUNCH_SLOTS="2")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    warned = [line for line in lines if "completed; warning: it reported no validation metric "
              "'loss'" in line]
    assert len(warned) == 2, r.stdout
    order = [next(i for i, line in enumerate(lines) if what in line)
             for what in ("trial 2: started", "trial 1: completed")]
    assert order[0] < order[1], r.stdout  # both ran at once (default: 2 slots // 1)
    # Item 2: a failure after a checkpoint, max_restarts 0 as in the tutorials.
    bug.touch()
    hparams = {"sleep": 0.0, "bug": str(bug), "validate": True}
    first = _experiment(tmp_path, "retry", hparams, {"name": "single"})
    # trial ids go on across the experiments root: nometric's were 1 and 2
    assert first.returncode == 1 and "trial 3: failed with exit status 3" in first.stdout
    again = _experiment(tmp_path, "retry", hparams, {"name": "single"})  # not fixed yet
    assert again.returncode == 1, again.stdout  # a failed experiment never exits 0
    assert "trial 3: retrying (it failed: exit status 3) from its latest checkpoint" \
        in again.stdout, again.stdout
    bug.unlink()  # the fix
    fixed = _experiment(tmp_path, "retry", hparams, {"name": "single"})
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "trial 3: retrying" in fixed.stdout and "trial 3: completed, loss=" in fixed.stdout
    log = (tmp_path / "det_experiments" / "retry" / "trials" / "3" / "output.log").read_text()
    assert log.count("resumed at 3") == 2, log  # from the checkpoint, not from the start
    assert re.search(r"^3 +completed +0\.1666", fixed.stdout, re.M), fixed.stdout


DIST_SCRIPT = '''
import time
from determined_launch import core

with core.init(distributed=core.DistributedContext.from_torch_distributed()) as ctx:
    for step in range(1, 100):
        if ctx.distributed.rank == 0 and step == 3:
            print("the genuine error", flush=True)
            raise SystemExit(7)
        ctx.distributed.allgather(step)
        time.sleep(0.05)
'''


@pytest.mark.slow
def test_a_failed_distributed_trial_shows_the_first_failure(tmp_path: pathlib.Path) -> None:
    (tmp_path / "dist.py").write_text(DIST_SCRIPT)
    cfg = tmp_path / "dist.yaml"
    cfg.write_text(json.dumps({"name": "dist", "max_restarts": 0,
                               "searcher": {"name": "single", "metric": "loss"},
                               "resources": {"slots_per_trial": 2}}))
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "experiment", str(cfg),
                        "torch", "--", sys.executable, "dist.py"], env=base_env(),
                       capture_output=True, text=True, timeout=90, check=False, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    shown = [line for line in r.stdout.splitlines() if line.startswith("  | ")]
    assert shown[-2] == "  | [rank=0] the genuine error", r.stdout
    assert "rank 0 on node 0" in shown[-1] and "status 7 first" in shown[-1], r.stdout
    assert not any("lost the connection" in line for line in shown), r.stdout
