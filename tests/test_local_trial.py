"""A trial off-cluster (issue 15, item 1) and resuming it (item 2)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import determined_launch as det
from determined_launch import core
from determined_launch.cluster import resolve_cluster_info
from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local_trial import LocalTrialOptions, complete
from determined_launch.errors import ClusterInfoError
from tests.conftest import WORKERS, Launch, base_env, exec_on_two_nodes

TUTORIAL = str(WORKERS / "tutorial_resume.py")


@pytest.fixture
def cwd(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.startswith("DET_") or var in ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE"):
            monkeypatch.delenv(var)
    return tmp_path


def test_off_cluster_there_is_a_local_trial(cwd: pathlib.Path) -> None:
    assert det.get_cluster_info() is None  # Determined's local mode
    info = resolve_cluster_info()  # what core.init() runs on there
    assert info.trial is not None and info.trial.local and info.resolved
    assert (info.trial.trial_id, info.trial.hparams, info.trial.trial_seed) == (0, {}, 0)
    assert info.latest_checkpoint is None
    with core.init() as ctx:  # same run directory as before trials existed off-cluster
        assert ctx.run_dir == cwd / "det_runs" / "local"


def test_hparams_from_json_text_and_files(
    cwd: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DET_LAUNCH_HPARAMS", '{"increment_by": 3, "opt": {"lr": 0.1}}')
    assert resolve_cluster_info().trial.hparams == {"increment_by": 3, "opt": {"lr": 0.1}}
    (cwd / "hp.json").write_text('{"a": 1}')
    (cwd / "hp.yaml").write_text("a: 2\nb: [1, 2]\n")
    monkeypatch.setenv("DET_LAUNCH_HPARAMS", "hp.json")
    assert resolve_cluster_info().trial.hparams == {"a": 1}
    monkeypatch.setenv("DET_LAUNCH_HPARAMS", str(cwd / "hp.yaml"))
    assert resolve_cluster_info().trial.hparams == {"a": 2, "b": [1, 2]}


@pytest.mark.parametrize("raw, message", [
    ('{"a": ', "DET_LAUNCH_HPARAMS: JSON: invalid JSON at line 1"),
    ("[1, 2]", "DET_LAUNCH_HPARAMS: JSON: expected an object of hyperparameters, got list"),
    ("missing.json", "DET_LAUNCH_HPARAMS: file missing.json: cannot read"),
])
def test_bad_hparams_are_one_line(
    cwd: pathlib.Path, monkeypatch: pytest.MonkeyPatch, raw: str, message: str
) -> None:
    monkeypatch.setenv("DET_LAUNCH_HPARAMS", raw)
    with pytest.raises(ClusterInfoError, match=message) as e:
        resolve_cluster_info()
    assert "\n" not in str(e.value)


def test_hparams_must_be_an_object(cwd: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (cwd / "list.json").write_text("[1]")
    monkeypatch.setenv("DET_LAUNCH_HPARAMS", "list.json")
    with pytest.raises(ClusterInfoError, match="expected an object of hyperparameters, got list"):
        resolve_cluster_info()


EXP = """
name: t
hyperparameters:
  increment_by: 4
  lr: {type: const, val: 0.5}
  model: {width: 8}
reproducibility: {experiment_seed: 42}
"""


def test_hparams_from_the_config_constants(
    cwd: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cwd / "exp.yaml").write_text(EXP)
    monkeypatch.setenv("DET_LAUNCH_CONFIG", "exp.yaml")
    trial = resolve_cluster_info().trial
    assert trial.hparams == {"increment_by": 4, "lr": 0.5, "model": {"width": 8}}
    assert trial.trial_seed == 42
    monkeypatch.setenv("DET_LAUNCH_HPARAMS", '{"increment_by": 1}')  # --hparams wins
    assert resolve_cluster_info().trial.hparams == {"increment_by": 1}


def test_a_range_in_the_config_points_at_det_launch_experiment(
    cwd: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cwd / "exp.yaml").write_text("hyperparameters:\n  lr: {type: double, minval: 0.1, "
                                  "maxval: 1.0}\n")
    monkeypatch.setenv("DET_LAUNCH_CONFIG", "exp.yaml")
    with pytest.raises(ClusterInfoError) as e:
        resolve_cluster_info()
    assert str(e.value).startswith("--config / DET_LAUNCH_CONFIG: config exp.yaml: "
                                   "hyperparameters.lr: is a double range")
    assert "det-launch experiment" in str(e.value)
    (cwd / "exp.yaml").write_text("hyperparameters: [\n")
    with pytest.raises(ClusterInfoError, match="exp.yaml: invalid YAML at line 2"):
        resolve_cluster_info()


def _info(**doc: Any) -> ClusterInfo:
    return ClusterInfo.from_mapping({"container_addrs": ["127.0.0.1"], "container_rank": 0,
                                     "container_slot_counts": [1], **doc}, source="t", where="t")


def _commit(run_dir: pathlib.Path, info: ClusterInfo, steps: int) -> str:
    with core.init(info=info, run_dir=str(run_dir)) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": steps}) as (_path, storage_id):
            pass
    return storage_id


def test_rerun_resumes_from_the_newest_committed_checkpoint(cwd: pathlib.Path) -> None:
    run = cwd / "det_runs" / "local"
    first = _commit(run, resolve_cluster_info(), 5)
    newest = _commit(run, resolve_cluster_info(), 10)
    assert newest != first
    assert resolve_cluster_info().latest_checkpoint == newest
    assert resolve_cluster_info({"DET_LAUNCH_FRESH": "1"}).latest_checkpoint is None
    # Other hyperparameters: another trial, which starts fresh.
    assert resolve_cluster_info({"DET_LAUNCH_HPARAMS": '{"a": 1}'}).latest_checkpoint is None
    with pytest.raises(ClusterInfoError, match="DET_LAUNCH_FRESH: expected one of"):
        resolve_cluster_info({"DET_LAUNCH_FRESH": "maybe"})
    # A checkpoint deleted since is no resume point: the newest still committed is.
    with core.init(run_dir=str(run)) as ctx:
        ctx.checkpoint.delete(newest)
    assert resolve_cluster_info().latest_checkpoint == first


def test_rerun_resumes_with_storage_given_as_a_yaml_block(
    cwd: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A storage block in a file (what det-launch experiment hands its trials) is no directory
    # to look into: the pointer, written only after a commit, names the resume point.
    block = cwd / "storage.yaml"
    block.write_text(f"type: shared_fs\nhost_path: {cwd / 'shared'}\n")
    monkeypatch.setenv("DET_CHECKPOINT_STORAGE", str(block))
    run = cwd / "det_runs" / "local"
    storage_id = _commit(run, resolve_cluster_info(), 5)
    assert (cwd / "shared" / storage_id / "metadata.json").is_file()
    assert resolve_cluster_info().latest_checkpoint == storage_id


def test_a_named_trial_resumes_only_its_own_checkpoints(cwd: pathlib.Path) -> None:
    trial7 = _info(trial={"trial_id": 7, "hparams": {}})
    ckpt = _commit(cwd / "det_runs" / "trial-7", trial7, 3)
    assert complete(trial7, {}).latest_checkpoint == ckpt
    # The same run directory under another trial: not this trial's checkpoint.
    trial8 = _info(trial={"trial_id": 8, "hparams": {}})
    env = {"DET_RUN_DIR": str(cwd / "det_runs" / "trial-7")}
    assert complete(trial8, env).latest_checkpoint is None
    # Given values are kept; resolved info is final.
    assert complete(_info(trial={"trial_id": 7}, latest_checkpoint="x"), {}
                    ).latest_checkpoint == "x"
    assert complete(_info(trial={"trial_id": 7}, resolved=True), {}).latest_checkpoint is None
    said: list[str] = []
    complete(trial7, {}, LocalTrialOptions(), say=said.append)
    assert len(said) == 1 and f"trial 7: info.latest_checkpoint is {ckpt}" in said[0]


def _run(argv: list[str], cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=base_env(**env), capture_output=True, text=True,
                          timeout=60)


def _xs(stdout: str) -> list[int]:
    return [int(line.rsplit(" ", 1)[1]) for line in stdout.splitlines() if "x is now" in line]


def _exec(argv: list[str], cwd: pathlib.Path, *flags: str,
          **env: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "determined_launch.cli", *flags, "exec", "--", *argv], cwd,
                **env)


@pytest.mark.slow
def test_tutorial_2_preempted_then_rerun_resumes(tmp_path: pathlib.Path) -> None:
    """Tutorial 2 asserts it is on a cluster (``info is not None``): it runs
    under ``det-launch exec``, whose rerun resumes the local trial."""
    from determined_launch.errors import EXIT_PREEMPTED

    preempt = tmp_path / "preempt-now"
    hp = ("--hparams", '{"increment_by": 2}')
    r = _exec([sys.executable, TUTORIAL], tmp_path, *hp, DET_PREEMPT_FILE=str(preempt),
              TOUCH_AT="7", TOUCH_FILE=str(preempt))
    assert r.returncode == EXIT_PREEMPTED, r.stderr
    assert _xs(r.stdout)[-1] == 20  # stopped at the checkpoint after step 10
    preempt.unlink()
    r = _exec([sys.executable, TUTORIAL], tmp_path, *hp, DET_PREEMPT_FILE=str(preempt))
    assert r.returncode == 0, r.stderr
    assert _xs(r.stdout) == list(range(22, 61, 2)), r.stdout
    assert r.stderr.count("det-launch: trial 0: info.latest_checkpoint is ") == 1, r.stderr
    r = _exec([sys.executable, TUTORIAL], tmp_path, *hp, "--fresh")
    assert r.returncode == 0 and _xs(r.stdout)[0] == 2 and "resuming" not in r.stderr
    # Bare, it is Determined's local mode: the tutorial's own assertion says so.
    r = _run([sys.executable, TUTORIAL], tmp_path)
    assert r.returncode == 1 and "this example only runs on-cluster" in r.stderr


@pytest.mark.slow
def test_tutorial_4_on_two_nodes_preempted_then_rerun_resumes(
    tmp_path: pathlib.Path, launches: list[Launch]
) -> None:
    preempt = tmp_path / "preempt-now"

    def two_nodes(**extra: str) -> list[Launch]:
        return exec_on_two_nodes(
            tmp_path, [sys.executable, str(TUTORIAL), "launcher"], launches,
            launcher_flags=("--preempt-file", str(preempt), "--hparams", '{"increment_by": 1}'),
            DET_RUN_DIR=str(tmp_path / "run"), DET_CHECKPOINT_STORAGE=str(tmp_path / "ckpts"),
            **extra)

    nodes = two_nodes(TOUCH_AT="1", TOUCH_FILE=str(preempt))
    for launch in reversed(nodes):
        assert launch.wait(60) == 75, launch.stderr  # preempted, resumable
    stopped = _xs(nodes[0].stdout)[-1]  # at a checkpoint: 2 ranks, 5 steps apart
    assert stopped % 10 == 0 and stopped < 60, nodes[0].stdout
    preempt.unlink()
    nodes = two_nodes()
    for launch in reversed(nodes):
        assert launch.wait(60) == 0, launch.stderr
        assert "det-launch: trial 0: info.latest_checkpoint is " in launch.stderr
        assert launch.leftovers(settle=0.0) == []
    assert _xs(nodes[0].stdout) == list(range(stopped + 2, 61, 2)), nodes[0].stdout
    runs = json.loads((tmp_path / "run" / "latest_checkpoint.json").read_text())
    assert runs["metadata"] == {"steps_completed": 30} and runs["trial_id"] == 0


def test_launcher_bad_hparams_and_config_are_one_line_exit_2(tmp_path: pathlib.Path) -> None:
    (tmp_path / "exp.yaml").write_text("hyperparameters:\n  lr: {type: log, minval: -3, "
                                       "maxval: -1}\n")
    for flags, message in (
        (["--hparams", "{bad"], "det-launch: error: --hparams / DET_LAUNCH_HPARAMS: JSON: "
                                "invalid JSON at line 1 column 2"),
        (["--config", "exp.yaml"], "det-launch: error: --config / DET_LAUNCH_CONFIG: config "
                                   "exp.yaml: hyperparameters.lr: is a log range"),
    ):
        r = _run([sys.executable, "-m", "determined_launch.cli", *flags, "exec", "--", "true"],
                 tmp_path)
        assert r.returncode == 2 and r.stderr.startswith(message), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_info_shows_what_the_workers_get(tmp_path: pathlib.Path) -> None:
    r = _run([sys.executable, "-m", "determined_launch.cli", "--hparams", '{"a": 1}', "info"],
             tmp_path)
    trial = json.loads(r.stdout)["cluster_info"]["trial"]
    assert r.returncode == 0 and trial["hparams"] == {"a": 1} and trial["local"] is True


def test_pointer_forms(tmp_path: pathlib.Path) -> None:
    """``pending`` (a commit under way) wins when committed; object storage is trusted."""
    from determined_launch.cluster.local_trial import latest_committed

    trial = det.TrialInfo(trial_id=0, hparams={}, local=True)
    run, store = tmp_path / "run", tmp_path / "store"
    run.mkdir()
    (store / "old").mkdir(parents=True)
    (store / "old" / "metadata.json").write_text("{}")
    pointer = run / "latest_checkpoint.json"
    pointer.write_text(json.dumps({"storage_id": "old", "pending": "new"}))
    assert latest_committed(run, store, trial) == "old"  # "new" never committed
    (store / "new").mkdir()
    (store / "new" / "metadata.json").write_text("{}")
    assert latest_committed(run, store, trial) == "new"
    assert latest_committed(run, None, trial) == "old"  # unverifiable: the committed one
    pointer.write_text(json.dumps({"storage_id": "../etc"}))
    assert latest_committed(run, None, trial) is None


def test_flags_and_variables_reach_the_launcher_options() -> None:
    from determined_launch.launch import config
    from determined_launch.launch.launcher import LauncherOptions

    flags = {"hparams": '{"a": 1}', "config": "exp.yaml", "fresh": True}
    opts = LauncherOptions.from_values(config.resolve({}, flags)).local_trial
    assert opts == LocalTrialOptions(hparams='{"a": 1}', config="exp.yaml", fresh=True)
    env = {"DET_LAUNCH_HPARAMS": "hp.json", "DET_LAUNCH_FRESH": "no"}
    assert LauncherOptions.from_env(env).local_trial == LocalTrialOptions(hparams="hp.json")
