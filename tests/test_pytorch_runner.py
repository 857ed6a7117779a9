"""The legacy entrypoint runner: config -> init/fit mapping (table-driven, pure)
and its command-line errors (one line, exit status 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from determined_launch.pytorch import Batch, Epoch, TrainUnit
from determined_launch.pytorch import __main__ as runner_main
from determined_launch.pytorch.api.runner import (
    RunnerError,
    parse_overrides,
    plan_run,
    read_config,
    resolve_hparams,
)

NEVER = Batch(sys.maxsize)

# Determined's harness defaults when the config says nothing.
DEFAULT_FIT = {
    "checkpoint_period": NEVER,
    "validation_period": NEVER,
    "reporting_period": Batch(100),
    "checkpoint_policy": None,  # fit()'s default, "best", without its local-mode warning
    "latest_checkpoint": "latest",
    "step_zero_validation": False,
    "test_mode": False,
    "profiling_enabled": True,  # system metrics on by default (issue 36 §4; Determined: off)
}


def _fit(**changes: Any) -> dict[str, Any]:
    out = dict(DEFAULT_FIT)
    out.update(changes)
    return out


HP = {"global_batch_size": {"type": "const", "val": 32}}

CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("defaults", {"hyperparameters": HP}, _fit()),
    (
        "max_length batches",
        {"hyperparameters": HP, "searcher": {"max_length": {"batches": 500}}},
        _fit(max_length=Batch(500)),
    ),
    (
        "max_length epochs",
        {"hyperparameters": HP, "searcher": {"max_length": {"epochs": 3}}},
        _fit(max_length=Epoch(3)),
    ),
    (
        "max_length records -> batches via global_batch_size",
        {"hyperparameters": HP, "searcher": {"max_length": {"records": 6400}}},
        _fit(max_length=Batch(200)),
    ),
    (
        "max_length bare int = batches",
        {"hyperparameters": HP, "searcher": {"max_length": 7}},
        _fit(max_length=Batch(7)),
    ),
    (
        "periods",
        {
            "hyperparameters": HP,
            "min_validation_period": {"batches": 50},
            "min_checkpoint_period": {"epochs": 2},
        },
        _fit(validation_period=Batch(50), checkpoint_period=Epoch(2)),
    ),
    (
        "period in records",
        {"hyperparameters": HP, "min_validation_period": {"records": 320}},
        _fit(validation_period=Batch(10)),
    ),
    (
        "scheduling_unit, policy, initial validation, profiling",
        {
            "hyperparameters": HP,
            "scheduling_unit": 10,
            "checkpoint_policy": "all",
            "perform_initial_validation": True,
            "profiling": {"enabled": True},
        },
        _fit(
            reporting_period=Batch(10),
            checkpoint_policy="all",
            step_zero_validation=True,
            profiling_enabled=True,
        ),
    ),
    (
        "records_per_epoch ignored",
        {"hyperparameters": HP, "records_per_epoch": 1000},
        _fit(),
    ),
]


@pytest.mark.parametrize("name,config,expected", CASES, ids=[c[0] for c in CASES])
def test_fit_mapping(name: str, config: dict[str, Any], expected: dict[str, Any]) -> None:
    plan = plan_run(config, "model_def:T")
    assert plan.fit_kwargs == expected
    assert plan.hparams == {"global_batch_size": 32}
    assert plan.exp_conf == config
    assert plan.entrypoint == "model_def:T"


def test_units_compare_by_type() -> None:
    # The table above relies on TrainUnit equality distinguishing the unit.
    assert Batch(3) != Epoch(3) and Batch(3) == Batch(3)
    assert TrainUnit._from_values(batches=0) == NEVER


@pytest.mark.parametrize(
    "optimizations,expected",
    [
        ({}, (1, False, True)),
        ({"aggregation_frequency": 4}, (4, False, True)),
        ({"gradient_compression": True, "average_aggregated_gradients": False}, (1, True, False)),
    ],
)
def test_optimizations_mapping(optimizations: dict, expected: tuple) -> None:
    plan = plan_run({"optimizations": optimizations}, "m:T")
    got = (plan.aggregation_frequency, plan.gradient_compression, plan.average_aggregated_gradients)
    assert got == expected


def test_test_mode_is_one_batch() -> None:
    plan = plan_run({"searcher": {"max_length": {"batches": 9}}}, "m:T", test_mode=True)
    assert plan.fit_kwargs == {"max_length": Batch(1), "test_mode": True}


@pytest.mark.parametrize(
    "explicit,info,expected",
    [(None, None, "latest"), (None, "abc", "abc"), ("/ckpt/dir", "abc", "/ckpt/dir")],
)
def test_latest_checkpoint_precedence(
    explicit: Optional[str], info: Optional[str], expected: str
) -> None:
    plan = plan_run({}, "m:T", latest_checkpoint=explicit, info_latest_checkpoint=info)
    assert plan.fit_kwargs["latest_checkpoint"] == expected


def test_entrypoint_from_config_and_no_config() -> None:
    assert plan_run({"entrypoint": "model_def:MyTrial"}).entrypoint == "model_def:MyTrial"
    plan = plan_run(None, "m:T")
    assert plan.exp_conf is None and plan.hparams == {}


@pytest.mark.parametrize(
    "spec,overrides,expected",
    [
        ({"a": 1, "b": {"type": "const", "val": "x"}}, {}, {"a": 1, "b": "x"}),
        ({"g": {"lr": {"type": "const", "val": 0.1}, "m": 0.9}}, {}, {"g": {"lr": 0.1, "m": 0.9}}),
        (
            {"o": {"type": "object", "vals": {"k": {"type": "const", "val": 2}}}},
            {},
            {"o": {"k": 2}},
        ),
        ({"lr": {"type": "double", "minval": 0.1, "maxval": 1}}, {"lr": 0.5}, {"lr": 0.5}),
        (
            {"g": {"lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1}}},
            {"g.lr": 0.01},
            {"g": {"lr": 0.01}},
        ),
        ({"a": 1}, {"new.deep": 3}, {"a": 1, "new": {"deep": 3}}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        (None, {}, {}),
    ],
)
def test_resolve_hparams(spec: Any, overrides: dict, expected: dict) -> None:
    assert resolve_hparams(spec, overrides) == expected


def test_trial_hparams_from_cluster_info_win() -> None:
    plan = plan_run(
        {"hyperparameters": {"lr": {"type": "int", "minval": 1, "maxval": 3}}},
        "m:T",
        trial_hparams={"lr": 2},
    )
    assert plan.hparams == {"lr": 2}


@pytest.mark.parametrize(
    "config,message",
    [
        (
            {"hyperparameters": {"lr": {"type": "double", "minval": 0, "maxval": 1}}},
            "--hparam lr=VALUE",
        ),
        (
            {"hyperparameters": {"c": {"type": "categorical", "vals": [1, 2]}}},
            "'categorical' range",
        ),
        ({"hyperparameters": {"x": {"type": "const"}}}, "has no 'val'"),
        ({"hyperparameters": {"x": {"type": "weird"}}}, "unknown type 'weird'"),
        ({"hyperparameters": [1, 2]}, "must be a mapping"),
        ({"optimizations": {"aggregation_frequency": 0}}, "aggregation_frequency' must be an int"),
        ({"optimizations": {"gradient_compression": "yes"}}, "true or false"),
        ({"optimizations": 3}, "'optimizations' must be a mapping"),
        ({"searcher": {"max_length": {"steps": 3}}}, "unknown unit 'steps'"),
        ({"searcher": {"max_length": {"batches": "3"}}}, "must be an integer"),
        ({"searcher": {"max_length": {"records": 300}}}, "needs hyperparameter global_batch_size"),
        ({"min_validation_period": {"batches": 1, "epochs": 1}}, "one of {batches: N}"),
        ({"scheduling_unit": 0}, "'scheduling_unit' must be an integer >= 1"),
        ({"checkpoint_policy": "sometimes"}, "best, all or none"),
        ({"hyperparameters": {"global_batch_size": "big"}}, "global_batch_size must be an int"),
    ],
)
def test_bad_config(config: dict, message: str) -> None:
    with pytest.raises(RunnerError, match=message.replace("(", r"\(").replace("{", r"\{")):
        plan_run(config, "m:T")


@pytest.mark.parametrize("entry", [None, "model_def", "model_def MyTrial", ""])
def test_bad_entrypoint(entry: Optional[str]) -> None:
    with pytest.raises(RunnerError, match="MODULE:CLASS"):
        plan_run({}, entry)


def test_parse_overrides() -> None:
    assert parse_overrides(["a=1", "b=0.5", "c=hello", "d=[1, 2]", "e="]) == {
        "a": 1,
        "b": 0.5,
        "c": "hello",
        "d": [1, 2],
        "e": None,
    }
    with pytest.raises(RunnerError, match="NAME=VALUE"):
        parse_overrides(["novalue"])


def test_read_config_yaml_json_and_errors(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("hyperparameters:\n  a: 1\n")
    assert read_config(str(tmp_path / "c.yaml")) == {"hyperparameters": {"a": 1}}
    (tmp_path / "c.json").write_text(json.dumps({"scheduling_unit": 1}))
    assert read_config(str(tmp_path / "c.json")) == {"scheduling_unit": 1}
    (tmp_path / "empty.yaml").write_text("")
    assert read_config(str(tmp_path / "empty.yaml")) == {}
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(RunnerError, match="bad.yaml: invalid YAML at line 2"):
        read_config(str(tmp_path / "bad.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(RunnerError, match="expected a mapping"):
        read_config(str(tmp_path / "list.yaml"))
    with pytest.raises(RunnerError, match="missing.yaml: cannot read"):
        read_config(str(tmp_path / "missing.yaml"))
    (tmp_path / "typo.yaml").write_text("min_validaton_period: {batches: 2}\n")
    with pytest.raises(RunnerError, match=r"typo.yaml: unknown field\(s\) min_validaton_period "
                                          r"\(did you mean min_validation_period\?\)"):
        read_config(str(tmp_path / "typo.yaml"))


# --- command line: one line, exit 2, no traceback --------------------------------


MODEL_DEF = """
from determined_launch import pytorch

class NotATrial:
    pass

class Broken(pytorch.PyTorchTrial):
    pass
"""


@pytest.mark.parametrize(
    "args,message",
    [
        (["--config", "missing.yaml", "model_def:Broken"], "missing.yaml: cannot read"),
        (["--config", "bad.yaml", "model_def:Broken"], "bad.yaml: invalid YAML"),
        (["nomodule:Trial", "--test"], "cannot import module 'nomodule'"),
        (["model_def:Nope", "--test"], "has no 'Nope'"),
        (["model_def:NotATrial", "--test"], "not a PyTorchTrial subclass"),
        (["model_def:Broken"], "no training length"),
        (["--config", "range.yaml", "model_def:Broken"], "--hparam lr=VALUE"),
        (["--bogus"], "unrecognized arguments"),
        (
            ["--test", "--latest-checkpoint", ".", "model_def:Broken"],
            "not a PyTorchTrial checkpoint",
        ),
        ([], "MODULE:CLASS"),
    ],
)
def test_cli_errors_one_line_exit_2(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "model_def.py").write_text(MODEL_DEF)
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    (tmp_path / "range.yaml").write_text(
        "hyperparameters:\n  lr: {type: double, minval: 0.1, maxval: 1}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "model_def", None)  # restored after the test
    monkeypatch.delitem(sys.modules, "model_def")
    for var in ("DET_CLUSTER_INFO_FILE",):
        monkeypatch.delenv(var, raising=False)
    assert runner_main.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("python -m determined_launch.pytorch: error: ")
    assert message in err[0]


def test_import_error_inside_user_module_keeps_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing dependency of the user's module is their error, not a usage error."""
    (tmp_path / "needs_dep.py").write_text("import not_installed_dep_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="not_installed_dep_xyz"):
        runner_main.load_trial_class("needs_dep:T")


def test_test_mode_refused_on_a_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    info = tmp_path / "trial.json"
    info.write_text(
        json.dumps(
            {
                "container_addrs": ["127.0.0.1"],
                "container_rank": 0,
                "container_slot_counts": [1],
                "trial": {"trial_id": 3, "hparams": {"lr": 1}},
            }
        )
    )
    monkeypatch.setenv("DET_CLUSTER_INFO_FILE", str(info))
    assert runner_main.main(["--test", "m:T"]) == 2
    assert "test_mode is only supported in local training mode" in capsys.readouterr().err
