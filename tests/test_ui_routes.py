"""det-launch ui's route tables: every path the pages and scripts used keeps its answer."""

from __future__ import annotations

import pathlib
import re

import pytest

from tests._ui_helpers import NAME, Served, make_experiment, make_run

pytest.importorskip("optuna")

EXP = f"/api/v1/experiments/{NAME}"
#: every page and /api/v1/ path of the if-chain server, with its answer then (GET)
OLD_PATHS = {
    "/": 200, "/experiments": 200, "/runs": 200, "/compare": 200, f"/experiments/{NAME}": 200,
    f"/experiments/{NAME}/": 200, f"/experiments/{NAME}/trials/2": 200, "/runs/local": 200,
    "/experiments/nope": 200,  # the page itself says 'not found'
    "/static/app.html": 200, "/static/app.css": 200, "/static/core.js": 200,
    "/static/pages/home.js": 200,
    "/api/v1/experiments": 200, "/api/v1/runs": 200, "/api/v1/actions": 200, EXP: 200,
    f"{EXP}/trials": 200, f"{EXP}/searcher_metric": 200, f"{EXP}/importance": 200,
    f"{EXP}/trials/1": 200, f"{EXP}/trials/1/metrics?group=validation": 200,
    f"{EXP}/trials/1/checkpoints": 200, f"{EXP}/trials/1/logs?rank=0": 200,
    "/api/v1/runs/local": 200, "/api/v1/runs/local/metrics?max_points=10": 200,
    "/api/v1/runs/local/checkpoints": 200, "/api/v1/runs/local/logs": 200,
    "/nope": 404, "/api": 404, "/api/v1": 404, "/api/v1/nope": 404, "/static/nope.js": 404,
    "/api/v1/experiments/nope": 404, f"{EXP}/nope": 404, f"{EXP}/trials/x": 404,
    f"{EXP}/trials/99": 404, f"{EXP}/trials/1/nope": 404, "/api/v1/runs/nope": 404,
    "/api/v1/runs/local/nope": 404, "/api/v1/runs/local/metrics?max_points=x": 404,
}


def test_every_old_path_answers_as_before(tmp_path: pathlib.Path) -> None:
    make_experiment(tmp_path / "det_experiments")
    make_run(tmp_path / "det_runs")
    served = Served(cwd=tmp_path)
    try:
        got = {path: served.get(path)[0] for path in OLD_PATHS}
        assert got == OLD_PATHS
        assert served.post(f"{EXP}/pause")[0] == 405  # no --actions: read-only
        assert served.post("/api/v1/experiments")[0] == 405
    finally:
        served.stop()


def test_the_front_end_routes_the_pages_the_server_serves() -> None:
    from determined_launch.ui import routes

    core = (pathlib.Path(routes.__file__).parent / "static" / "core.js").read_text()
    table = core[core.index("const ROUTES = ["):]
    front = {re.sub(r":(\w+)", r"{\1}", p) for p in re.findall(r'^  \["(/[^"]*)"', table, re.M)}
    assert front == {pattern.replace(":int}", "}") for _, pattern, handler in routes.ROUTES
                     if handler is routes.page}


def test_a_pattern_matches_whole_segments() -> None:
    from determined_launch.ui.routes import match

    assert match("/experiments/{name}/trials/{tid:int}", ["experiments", "a b", "trials", "7"]
                 ) == {"name": "a b", "tid": "7"}
    assert match("/experiments/{name}/trials/{tid:int}", ["experiments", "a", "trials", "x"]
                 ) is None
    assert match("/experiments/{name}", ["experiments", "a", "trials"]) is None
    assert match("/static/{file*}", ["static", "pages", "home.js"]) == {"file": "pages/home.js"}
    assert match("/", [""]) == {}
