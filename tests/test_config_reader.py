"""One experiment-config reader (determined_launch/expconf.py) for `det-launch experiment`,
`det-launch --config` and the legacy runner: the same file gets the same one-line verdict
(naming the file and the field, with the close match) and exit status 2 from all three, and
`resources.slots_per_trial` sizes a `--config` run unless `--slots` says otherwise."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from determined_launch import expconf
from determined_launch.experiment import expconf as experiment_expconf
from tests.conftest import base_env

SEARCHER = "searcher: {name: single, metric: loss, max_length: {batches: 4}}\n"


def _cli(args: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=base_env(), capture_output=True,
                          text=True, timeout=60)


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("body, want", [
    (SEARCHER + "min_validaton_period: {batches: 2}\n",
     "exp.yaml: unknown field(s) min_validaton_period (did you mean min_validation_period?)"),
    (SEARCHER + "resources: {slots_per_trail: 2}\n",
     "exp.yaml: resources: unknown field(s) slots_per_trail (did you mean slots_per_trial?)"),
    (SEARCHER + "optimizations: {aggregation_frequncy: 2}\n",
     "exp.yaml: optimizations: unknown field(s) aggregation_frequncy (did you mean "
     "aggregation_frequency?)"),
    ("searcher: {name: single, metric: loss, max_lenght: 4}\n",
     "exp.yaml: searcher: unknown field(s) max_lenght (did you mean max_length?) for searcher "
     "single"),
])
def test_both_readings_give_the_same_line(tmp_path: pathlib.Path, body: str, want: str) -> None:
    (tmp_path / "exp.yaml").write_text("hyperparameters: {lr: 0.1}\n" + body)
    with pytest.raises(expconf.ConfigError) as e:
        experiment_expconf.load(tmp_path / "exp.yaml")
    assert str(e.value) == f"{tmp_path / 'exp.yaml'}: {want.partition(': ')[2]}"
    with pytest.raises(expconf.ConfigError) as e:
        expconf.load(tmp_path / "exp.yaml", trial=True)  # what the other two read it with
    assert str(e.value).endswith(want.partition(": ")[2])


def test_the_three_commands_refuse_a_typo_alike(tmp_path: pathlib.Path) -> None:
    (tmp_path / "exp.yaml").write_text(SEARCHER + "min_validaton_period: {batches: 2}\n")
    want = "exp.yaml: unknown field(s) min_validaton_period (did you mean min_validation_period?)"
    runs = {
        "det-launch experiment": ["-m", "determined_launch.cli", "experiment", "exp.yaml",
                                  "exec", "--", "true"],
        "det-launch --config": ["-m", "determined_launch.cli", "--config", "exp.yaml",
                                "--dry-run", "exec", "--", "true"],
        "legacy runner": ["-m", "determined_launch.pytorch", "--config", "exp.yaml",
                          "model_def:Trial"],
    }
    for who, args in runs.items():
        line = _one_line(_cli(args, tmp_path))
        assert line.endswith(want), (who, line)


def test_one_trial_needs_no_searcher_but_an_experiment_does(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "my const.yaml"  # a file name that names no experiment directory
    path.write_text("hyperparameters: {lr: 0.1}\n")
    assert expconf.load(path, trial=True).raw == {"hyperparameters": {"lr": 0.1}}
    (tmp_path / "empty.yaml").write_text("")
    assert expconf.load(tmp_path / "empty.yaml", trial=True).raw == {}
    with pytest.raises(expconf.ConfigError, match="searcher: expected a mapping"):
        expconf.load(path)


def _nproc(r: subprocess.CompletedProcess[str]) -> int:
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    return int(words[words.index("--nproc_per_node") + 1])


def test_config_slots_per_trial_sizes_the_run_and_slots_wins(tmp_path: pathlib.Path) -> None:
    (tmp_path / "distributed.yaml").write_text(
        "hyperparameters: {lr: 0.1}\n" + SEARCHER + "resources: {slots_per_trial: 3}\n")
    plan = ["-m", "determined_launch.cli", "--config", "distributed.yaml", "--dry-run"]
    tail = ["torch", "--", "python", "-c", "pass"]
    assert _nproc(_cli([*plan, *tail], tmp_path)) == 3
    assert _nproc(_cli([*plan, "--slots", "2", *tail], tmp_path)) == 2


def test_config_slots_per_trial_is_not_applied_per_node(tmp_path: pathlib.Path) -> None:
    # slots_per_trial counts the whole trial: on two nodes the allocation's slots stand.
    (tmp_path / "distributed.yaml").write_text(SEARCHER + "resources: {slots_per_trial: 8}\n")
    info = {"container_addrs": ["127.0.0.1", "127.0.0.2"], "container_rank": 0,
            "container_slot_counts": [2, 2]}
    (tmp_path / "info.json").write_text(json.dumps(info))
    env = base_env(DET_CLUSTER_INFO_FILE=str(tmp_path / "info.json"))
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--config",
                        "distributed.yaml", "--dry-run", "torch", "--", "python", "-c", "pass"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert _nproc(r) == 2
    assert "resources.slots_per_trial 8 not applied: this job has 2 nodes" in r.stderr
