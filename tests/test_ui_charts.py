"""det-launch ui's charts: uPlot is shipped in the wheel (no CDN), served with a
long cache, and the API lists and serves any metric of any group for them."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from determined_launch.core._rundir import RunDir
from determined_launch.ui import metric_series
from determined_launch.ui.api import Api
from tests._ui_helpers import NAME, Served, make_experiment

pytest.importorskip("optuna")
ROOT = pathlib.Path(__file__).resolve().parent.parent
VENDOR = ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE")


def test_the_wheel_ships_the_vendored_chart_library(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("determined_launch", "wrap_rank"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=skip)
    out = subprocess.run(
        [sys.executable, "-c", "from setuptools import build_meta as b; print(b.build_wheel('w'))"],
        cwd=src, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = src / "w" / out.stdout.strip().splitlines()[-1]
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in VENDOR:
        assert f"determined_launch/ui/static/vendor/{f}" in names
    assert "determined_launch/ui/static/app.html" in names


def _with_custom_group(tmp_path: pathlib.Path) -> pathlib.Path:
    exps = tmp_path / "det_experiments"
    exp = make_experiment(exps)
    for tid in (1, 2):  # a user's report_metrics(group="eval_extra", ...)
        run = RunDir(exp / "trials" / str(tid), trial_id=tid)
        for step in (10, 20):
            run.append("eval_extra", {"steps_completed": step,
                                      "metrics": {"bleu": tid * 10 + step, "note": "text"}})
    return exps


def test_the_api_lists_and_serves_any_metric_of_any_group(tmp_path: pathlib.Path) -> None:
    api = Api([str(_with_custom_group(tmp_path))])
    names = metric_series.experiment_names(api, NAME, None)
    assert names == {"groups": {"training": ["loss"], "validation": ["loss"],
                                "eval_extra": ["bleu"]},  # numbers only: "note" is no curve
                     "categorical_hparams": ["width"]}  # [32, 64]: two categories, no scale
    curves = metric_series.experiment_metric(api, NAME, "eval_extra", "bleu", [1, 2, 99])
    assert curves == [{"trial_id": 1, "points": [[10, 20], [20, 30]]},
                      {"trial_id": 2, "points": [[10, 30], [20, 40]]}]  # 99: no such trial
    assert metric_series.experiment_names(api, "nope", None) is None
    assert metric_series.parse_trials("3, 1") == [3, 1]
    with pytest.raises(ValueError):
        metric_series.parse_trials(",".join(["1"] * 301))


def test_the_server_serves_uplot_and_the_metric_endpoints(tmp_path: pathlib.Path) -> None:
    exps = _with_custom_group(tmp_path)
    ui = Served(str(exps))
    try:
        status, headers, body = ui.get("/static/vendor/uPlot.iife.min.js")
        assert status == 200 and body.startswith(b"/*! https://github.com/leeoniya/uPlot")
        assert "max-age=" in headers["Cache-Control"] and "javascript" in headers["Content-Type"]
        assert ui.get("/static/vendor/nope.js")[0] == 404
        assert ui.json(f"/api/v1/experiments/{NAME}/metric_names?trials=1")["groups"] == {
            "training": ["loss"], "validation": ["loss"], "eval_extra": ["bleu"]}
        curves = ui.json(f"/api/v1/experiments/{NAME}/metrics?group=eval_extra&metric=bleu")
        assert [c["trial_id"] for c in curves] == [1, 2, 3, 4]
        assert curves[0]["points"] == [[10, 20], [20, 30]] and curves[2]["points"] == []
        one = ui.json(f"/api/v1/experiments/{NAME}/trials/1/metric_names")
        assert one["groups"]["eval_extra"] == ["bleu"]
        status, _, body = ui.get(f"/api/v1/experiments/{NAME}/metrics?group=x&metric=y&trials=a")
        assert status == 404  # like any malformed number in a query (server._int)
        assert ui.get("/api/v1/experiments/nope/metric_names")[0] == 404
    finally:
        ui.stop()
    assert json.dumps(curves)  # plain JSON numbers
