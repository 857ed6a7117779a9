"""Determined's local mode (issue 23, item 2): ``get_cluster_info()`` is ``None``
in a bare process and present under our launchers or a scheduler; a trial
nothing gave hyperparameters names the fix; ``--config`` carries the searcher."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import socket
from typing import Any

import pytest

import determined_launch as det
from determined_launch.cluster import resolve_cluster_info
from determined_launch.cluster.info import ClusterInfo, MissingHParamError, TrialInfo
from determined_launch.cluster.local_trial import LocalTrialOptions, local_trial, searcher_env
from determined_launch.errors import ClusterInfoError

BARE = {"DET_INFO_DIR": "/nonexistent", "PATH": "/bin"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


@pytest.fixture
def cwd(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _info_file(tmp_path: pathlib.Path, **doc: Any) -> str:
    path = tmp_path / "info.json"
    # What our launchers write for their workers: the source is the detector
    # the launcher matched ("local" on a laptop), not the file.
    path.write_text(json.dumps({"source": "local", "container_addrs": ["127.0.0.1"],
                                "container_rank": 0, "container_slot_counts": [1], **doc}))
    return str(path)


def _pbs(tmp_path: pathlib.Path) -> dict[str, str]:
    nodes = tmp_path / "nodes"
    nodes.write_text(socket.gethostname() + "\n")
    return {"PBS_JOBID": "1.pbs", "PBS_NODEFILE": str(nodes)}


def test_a_bare_process_is_local_mode(cwd: pathlib.Path) -> None:
    assert det.get_cluster_info(BARE) is None
    # core.init() still has an info to run on: this machine and the local trial.
    info = resolve_cluster_info(BARE)
    assert info.source == "local" and info.trial is not None and info.trial.local


def test_our_launchers_workers_and_schedulers_get_the_info(
        cwd: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # A launcher's file says source "local": still not local mode (it was once).
    info = det.get_cluster_info({**BARE, "DET_CLUSTER_INFO_FILE": _info_file(tmp_path)})
    assert info is not None and info.trial is not None and info.trial.trial_id == 0
    pbs = det.get_cluster_info({**BARE, **_pbs(tmp_path)})
    assert pbs is not None and pbs.source == "pbs" and pbs.trial is not None


def test_bare_torchrun_is_local_mode_unless_inside_a_scheduler(
        cwd: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assert det.get_cluster_info({**BARE, **TORCHRUN}) is None  # as Determined's
    multi_node = {**BARE, **TORCHRUN, "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "4"}
    assert det.get_cluster_info(multi_node) is None  # no error: nothing to describe
    inside = det.get_cluster_info({**BARE, **TORCHRUN, **_pbs(tmp_path)})
    assert inside is not None and inside.source == "torchrun"  # innermost wins, as before


def test_forced_detectors(cwd: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assert det.get_cluster_info({**BARE, "DET_LAUNCH_DETECTOR": "local"}) is None
    env = {**BARE, "DET_LAUNCH_DETECTOR": "file", "DET_CLUSTER_INFO_FILE": _info_file(tmp_path)}
    assert det.get_cluster_info(env) is not None
    with pytest.raises(ClusterInfoError, match="'file' was forced but does not match"):
        det.get_cluster_info({**BARE, "DET_LAUNCH_DETECTOR": "file"})


def test_a_missing_hparam_of_a_trial_nothing_gave_any_names_the_fix(
        tmp_path: pathlib.Path) -> None:
    trial = local_trial(LocalTrialOptions())
    with pytest.raises(KeyError) as e:  # code catching KeyError still catches it
        trial.hparams["n_filters1"]
    assert isinstance(e.value, MissingHParamError)
    message = str(e.value)
    assert "\n" not in message and message.startswith("hyperparameter 'n_filters1'")
    assert "--config const.yaml" in message and "--hparams" in message
    assert trial.hparams == {} and trial.hparams.get("n_filters1") is None
    # Through the cluster-info file our launchers hand their workers.
    info = ClusterInfo.from_json_file(
        _info_file(tmp_path, trial=dataclasses.asdict(trial)), source="file")
    assert info.trial is not None
    with pytest.raises(MissingHParamError):
        info.trial.hparams["lr"]
    # Hyperparameters someone gave: a missing one is an ordinary KeyError.
    given = TrialInfo(trial_id=0, hparams={"a": 1}, local=True)
    with pytest.raises(KeyError) as plain:
        given.hparams["b"]
    assert type(plain.value) is KeyError


def test_config_carries_max_length_and_the_searcher(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "const.yaml"
    config.write_text("hyperparameters: {lr: 0.1}\nsearcher: {name: single, metric: loss, "
                      "smaller_is_better: false, max_length: {epochs: 3}}\n")
    opts = LocalTrialOptions(config=str(config))
    trial = local_trial(opts)
    assert (trial.max_length, dict(trial.hparams)) == (3, {"lr": 0.1})
    assert searcher_env(opts, {}) == {"DET_SEARCHER_METRIC": "loss",
                                      "DET_SMALLER_IS_BETTER": "false",
                                      "DET_SEARCHER_UNIT": "EPOCHS"}
    # What the launcher's own environment sets wins.
    assert "DET_SEARCHER_METRIC" not in searcher_env(opts, {"DET_SEARCHER_METRIC": "acc"})
    config.write_text("searcher: {name: single, metric: loss, max_length: 64}\n")
    assert local_trial(opts).max_length == 64
    assert "DET_SEARCHER_UNIT" not in searcher_env(opts, {})
    config.write_text("searcher: {name: single, max_length: {epochs: many}}\n")
    with pytest.raises(ClusterInfoError) as e:
        local_trial(opts)
    assert str(e.value).startswith("--config / DET_LAUNCH_CONFIG: ")
    assert "searcher.max_length" in str(e.value) and "\n" not in str(e.value)
    # 0.38's max_time is the time metric's length, not the trial's.
    config.write_text("searcher: {name: single, metric: loss, time_metric: batches, "
                      "max_time: 9}\n")
    assert local_trial(opts).max_length is None
    # No searcher block: nothing to hand on.
    config.write_text("hyperparameters: {lr: 0.1}\n")
    assert (local_trial(opts).max_length, searcher_env(opts, {})) == (None, {})


def test_core_init_in_local_mode_uses_the_config_length(
        cwd: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("DET_")]:
        monkeypatch.delenv(var)
    (cwd / "exp.yaml").write_text("searcher: {name: single, metric: x, max_length: 7}\n")
    monkeypatch.setenv("DET_LAUNCH_CONFIG", "exp.yaml")
    with det.core.init() as ctx:
        assert ctx.searcher.max_length == 7
