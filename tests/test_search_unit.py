"""det-launch experiment's pure parts: config, brackets, argv, searcher API (no processes)."""

from __future__ import annotations

import ast
import os
import pathlib
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from determined_launch.core import SearcherContext, SearcherMode, Unit
from determined_launch.core._dummy import _dummy_init
from determined_launch.core.searcher import configured_unit
from determined_launch.errors import LaunchError
from determined_launch.experiment import cli as ecli
from determined_launch.experiment import command, expconf
from determined_launch.experiment import searchers as se

P = pathlib.Path("exp.yaml")


def conf(**searcher: Any) -> expconf.ExperimentConfig:
    raw = {"hyperparameters": {"x": {"type": "double", "minval": 0, "maxval": 1, "count": 2}},
           "searcher": {"name": "random", "metric": "loss", "max_trials": 4, **searcher}}
    return expconf.parse(raw, P)


def test_searcher_forms() -> None:
    c = conf(max_length={"batches": 64})
    assert (c.searcher.max_length, c.searcher.unit, c.searcher.time_metric) == (64, "batches",
                                                                                None)
    c = conf(max_length=10)
    assert (c.searcher.max_length, c.searcher.unit) == (10, None)
    c = conf(time_metric="batches", max_time=100)  # Determined 0.38's form
    assert (c.searcher.max_length, c.searcher.time_metric) == (100, "batches")
    asha = conf(name="adaptive_asha", max_length=64, max_trials=16)
    assert (asha.searcher.mode, asha.searcher.divisor, asha.searcher.max_rungs) == (
        "standard", 4.0, 5)
    assert conf().max_restarts == 5 and conf().name == "exp"


@pytest.mark.parametrize("raw, message", [
    ({"searcher": {"name": "pbt", "metric": "m"}}, "exp.yaml: searcher.name: unknown searcher "
                                                   "'pbt'"),
    ({"searcher": {"name": "random", "metric": "m", "max_trials": 2, "bogus": 1}},
     "exp.yaml: searcher: unknown field(s) bogus for searcher random"),
    ({"searcher": {"name": "random", "metric": "m"}}, "exp.yaml: searcher.max_trials: required"),
    ({"searcher": {"name": "adaptive_asha", "metric": "m", "max_trials": 2}},
     "exp.yaml: searcher: adaptive_asha needs max_length"),
    ({"searcher": {"name": "grid", "metric": "m", "max_length": {"steps": 3}}},
     "exp.yaml: searcher.max_length: expected an integer or one of {batches|records|epochs: N}"),
    ({"searcher": {"name": "grid", "metric": "m", "max_length": 3, "time_metric": "b",
                   "max_time": 3}}, "exp.yaml: searcher: give max_length or time_metric"),
    ({"searcher": {"name": "adaptive_asha", "metric": "m", "max_length": 8, "max_trials": 2,
                   "mode": "wild"}}, "exp.yaml: searcher.mode: 'wild'"),
    ({"searcher": {"name": "single", "metric": "m"}, "hyperparameters":
      {"lr": {"type": "double", "minval": 0.1, "maxval": 0.01}}},
     "exp.yaml: hyperparameters.lr: minval 0.1 > maxval 0.01"),
    ({"searcher": {"name": "single", "metric": "m"}, "typo_field": 1},
     "exp.yaml: unknown field(s) typo_field"),
    ({"searcher": {"name": "single", "metric": "m"}, "entrypoint": 3},
     "exp.yaml: entrypoint: expected a string or a list of strings"),
    ({"searcher": {"name": "single", "metric": "m"}, "max_restarts": -1},
     "exp.yaml: max_restarts: expected an integer >= 0"),
    ({"searcher": "grid"}, "exp.yaml: searcher: expected a mapping"),
])
def test_bad_configs_are_one_line(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(LaunchError) as err:
        expconf.parse(raw, P)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_bad_yaml_names_line(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("searcher:\n  name: [grid\n")
    with pytest.raises(LaunchError, match=r"bad.yaml: invalid YAML at line \d+ column \d+"):
        expconf.load(f)
    with pytest.raises(LaunchError, match="cannot read"):
        expconf.load(tmp_path / "missing.yaml")


def test_ignored_fields_are_listed() -> None:
    c = expconf.parse({"searcher": {"name": "single", "metric": "m", "source_trial_id": 3},
                       "environment": {}, "bind_mounts": [],
                       "resources": {"slots_per_trial": 2, "resource_pool": "gpu"}}, P)
    assert c.slots_per_trial == 2
    assert c.ignored == ("bind_mounts", "environment", "searcher.source_trial_id",
                         "resources.resource_pool")


def test_brackets_follow_determined() -> None:
    s = conf(name="adaptive_asha", max_length=64, max_trials=16, divisor=4).searcher
    # max_rungs 5 capped by log4(64)+1=4 and log4(16)+1=3; standard: 2..3
    assert se.brackets(s, 16) == [3, 2]
    assert se.bracket_trials(16, 4, [3, 2]) == [12, 4]
    assert se.rung_lengths(3, 4, 64) == [4, 16, 64]
    assert se.rung_lengths(5, 4, 64) == [1, 1, 4, 16, 64]
    aggressive = conf(name="adaptive_asha", max_length=64, max_trials=16, mode="aggressive")
    assert se.brackets(aggressive.searcher, 16) == [3]
    cons = conf(name="adaptive_asha", max_length=1000, max_trials=1000, mode="conservative")
    assert se.brackets(cons.searcher, 1000) == [5, 4, 3, 2, 1]
    older = expconf.parse({"searcher": {"name": "async_halving", "metric": "m", "num_rungs": 3,
                                        "max_length": 64, "max_trials": 4}}, P).searcher
    assert se.brackets(older, 4) == [3]  # one bracket of num_rungs, not capped
    given = conf(name="adaptive_asha", max_length=64, max_trials=9, bracket_rungs=[1, 3])
    assert se.brackets(given.searcher, 9) == [3, 1]
    assignment = [se.bracket_of(i, [12, 4]) for i in range(16)]
    assert assignment.count(0) == 12 and assignment.count(1) == 4
    assert 1 in assignment[:4]  # early trials already cover both brackets


def test_grid_points_and_count_errors() -> None:
    c = expconf.parse({"hyperparameters": {
        "lr": {"type": "double", "minval": 0.001, "maxval": 0.1, "count": 3},
        "layers": {"type": "categorical", "vals": [1, 2]}, "k": 5},
        "searcher": {"name": "grid", "metric": "m"}}, P)
    search = se.Search(c)
    assert search.max_trials == 6
    assert {(p["lr"], p["layers"]) for p in search.grid} == {
        (lr, n) for lr in (0.001, 0.0505, 0.1) for n in (1, 2)}
    no_count = expconf.parse({"hyperparameters": {"lr": {"type": "double", "minval": 0,
                                                         "maxval": 1}},
                              "searcher": {"name": "grid", "metric": "m"}}, P)
    with pytest.raises(LaunchError, match="^hyperparameters.lr: a grid search needs a count"):
        se.Search(no_count)


def test_nonprimitive_categoricals_go_by_index() -> None:
    c = expconf.parse({"hyperparameters": {"arch": {"type": "categorical",
                                                    "vals": [[1, 2], {"a": 1}]}},
                       "searcher": {"name": "random", "metric": "m", "max_trials": 1}}, P)
    search = se.Search(c)
    assert search.hparams({"arch": 1}) == {"arch": {"a": 1}}


def test_storage_label_hides_passwords() -> None:
    assert se.storage_label("postgresql://bob:s3cret@127.0.0.1:5432/db") == \
        "postgresql://bob:***@127.0.0.1:5432/db"
    assert se.storage_label("postgresql://bob@h/db") == "postgresql://bob@h/db"
    assert se.storage_label("/shared/study.journal") == "/shared/study.journal"


def test_argv_split_and_entrypoints() -> None:
    p = ecli.parser()
    ours, cmd = ecli.split_argv(p, ["exp.yaml", "--slots", "2", "--worker", "torch", "--",
                                    "python", "t.py", "--slots", "9"])
    assert ours == ["exp.yaml", "--slots", "2", "--worker"]
    assert cmd == ["torch", "--", "python", "t.py", "--slots", "9"]
    assert ecli.split_argv(p, ["--status", "d"]) == (["--status", "d"], [])
    assert command.entrypoint_command(
        "python3 -m determined.launch.torch_distributed python3 train.py".split(), "x") == (
        "torch", [sys.executable, "train.py"])
    assert command.entrypoint_command(["python3", "train.py"], "x") == (
        "exec", ["--", sys.executable, "train.py"])
    assert command.entrypoint_command(["/opt/py/bin/python3", "train.py"], "x") == (
        "exec", ["--", "/opt/py/bin/python3", "train.py"])
    # a legacy Trial class runs in the legacy runner, with the experiment's own config
    assert command.entrypoint_command(["model_def:MyTrial"], "exp.yaml") == (
        "torch", ["--", sys.executable, "-m", "determined_launch.pytorch", "--config",
                  os.path.abspath("exp.yaml"), "model_def:MyTrial"])
    ns = p.parse_args(["exp.yaml", "--slots", "2", "--dry-run", "--preempt-grace", "5"])
    assert command.trial_flags(ns) == ["--preempt-grace", "5", "--dry-run"]


def test_searcher_api_like_determined(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [u.value for u in Unit] == ["EPOCHS", "RECORDS", "BATCHES"]
    assert SearcherMode("WORKERS_ASK_CHIEF") is SearcherMode.WorkersAskChief
    monkeypatch.setenv("DET_SEARCHER_UNIT", "batches")
    assert configured_unit() is Unit.BATCHES
    monkeypatch.setenv("DET_SEARCHER_UNIT", "")
    assert configured_unit() is None
    with _dummy_init() as ctx:
        ctx.searcher._max_length = 3
        lengths = []
        for op in ctx.searcher.operations(searcher_mode=SearcherMode.ChiefOnly, auto_ack=False):
            lengths.append(op.length)
            op.report_completed(0.5)
        assert lengths == [3]
        ctx.searcher.acknowledge_out_of_ops()
        assert ctx.searcher.get_configured_units() is None
        worker = SearcherContext(SimpleNamespace(rank=1), ctx.searcher._run_dir,  # type: ignore
                                 ctx.train, 3)
        with pytest.raises(RuntimeError, match=r"ChiefOnly\) was called on a non-chief"):
            next(iter(worker.operations(searcher_mode=SearcherMode.ChiefOnly)))
        assert [op.length for op in worker.operations()] == [3]


def test_docs_list_every_experiment_option() -> None:
    docs = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "search.md").read_text()
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    for o in ecli.OPTIONS:
        row = next((line for line in docs.splitlines() if line.startswith(f"| `{o.flag}")), None)
        assert row is not None and f"`{o.env}`" in row, o.flag
        assert o.flag in readme, o.flag


def test_the_experiment_layer_imports_no_extra_until_a_search_runs() -> None:
    import subprocess
    import sys

    code = ("import sys, determined_launch.cli, determined_launch.experiment.run; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'optuna', 'matplotlib', 'sqlalchemy', 'yaml', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**__import__("os").environ,
                                          "PYTHONPATH": str(pathlib.Path(__file__).parent.parent)})
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("name", command.TRIAL_IDENTITY)
def test_one_run_trial_options_are_refused(name: str) -> None:
    from determined_launch.launch import config

    option = next((o for o in config.OPTIONS if o.name == name), None)
    if option is None or option.flag is None:
        pytest.skip(f"no launcher option {name!r} in this checkout")
    argv = ["exp.yaml", option.flag] + ([] if option.switch else ["x"])
    ns = ecli.parser().parse_args(argv)
    with pytest.raises(LaunchError, match=f"^{option.flag} sets one run's trial"):
        command.refuse_trial_identity(ns)
    assert option.flag not in command.trial_flags(ns) and option.env in command.trial_identity_env()


def test_a_trial_whose_asker_died_before_its_slot_is_dropped(tmp_path: pathlib.Path) -> None:
    optuna = pytest.importorskip("optuna")
    import time

    from determined_launch.experiment import driver as dr

    c = conf()
    search = se.Search(c)
    study = se.load_study(se.open_storage(None, str(tmp_path / "s.journal")), "u", search)
    t = study.ask()  # the asker died here: RUNNING, no slot, no owner
    d = dr.Driver.__new__(dr.Driver)  # only the study-facing parts are needed
    d.study, d.optuna, d.search = study, optuna, search
    frozen = study._storage.get_trial(t._trial_id)
    d._drop_unborn(frozen, time.time())  # a live asker may still be setting it up
    assert study._storage.get_trial(t._trial_id).state.name == "RUNNING"
    d._drop_unborn(frozen, time.time() + dr.LEASE + 1)
    after = study._storage.get_trial(t._trial_id)
    assert after.state.name == "FAIL" and after.user_attrs[se.ATTR_SURPLUS]


def test_experiment_variables_are_the_options_variables() -> None:
    from determined_launch.experiment.driver import EXPERIMENT_ENV

    assert set(EXPERIMENT_ENV) == {o.env for o in ecli.OPTIONS}


def test_the_example_config_loads_and_maps_its_entrypoint() -> None:
    example = pathlib.Path(__file__).resolve().parent.parent / "examples" / "search"
    c = expconf.load(example / "adaptive.yaml")
    assert (c.searcher.name, c.searcher.time_metric, c.searcher.max_length) == (
        "adaptive_asha", "batches", 400)
    assert c.entrypoint is not None
    # "no torch needed": its entrypoint runs the script as it is, and the script imports no torch
    assert command.entrypoint_command(c.entrypoint, "x") == (
        "exec", ["--", sys.executable, "train.py"])
    script = (example / "train.py").read_text()
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(script))
                if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])}
    assert "torch" not in imported and "determined_launch" in imported
