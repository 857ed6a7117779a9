"""A large experiment in a real browser (issue 36 §3): the trial table is drawn
before the importance answer comes, in pages, with a filter box. No timings here
(benchmarks/bench_ui_browser.py has them)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests._ui_helpers import Served, browsing, playwright_or_skip

pytest.importorskip("optuna")
playwright_or_skip()
TRIALS = 1100
ROW = "main table.data-table tbody tr"  # not a chart legend's


def _experiment(root: pathlib.Path) -> None:
    import optuna
    from optuna.distributions import FloatDistribution

    from determined_launch.experiment import searchers as se

    exp = root / "det_experiments" / "many"
    exp.mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps({
        "name": "many", "storage": None, "storage_has_password": False,
        "searcher": {"name": "random", "metric": "loss", "smaller_is_better": True,
                     "max_trials": TRIALS}}))
    study = optuna.create_study(study_name="many",
                                storage=se.open_storage(None, str(exp / "study.journal")))
    dist: dict[str, Any] = {"lr": FloatDistribution(1e-4, 1.0)}
    study.add_trials([optuna.trial.create_trial(
        params={"lr": (i + 1) / (TRIALS + 1)}, distributions=dist,
        intermediate_values={10: 1.0 + i}, value=1.0 + i,
        user_attrs={se.ATTR_HPARAMS: {"lr": (i + 1) / (TRIALS + 1)}}) for i in range(TRIALS)])


@pytest.fixture
def page(tmp_path: pathlib.Path) -> Iterator[tuple[Served, Any]]:
    _experiment(tmp_path)
    with browsing(cwd=tmp_path) as served_page:
        yield served_page


@pytest.mark.slow
def test_the_table_is_drawn_before_importance_and_pages_and_filters(
        page: tuple[Served, Any]) -> None:
    served, tab = page
    held: list[Any] = []
    tab.route("**/importance", lambda route: held.append(route))  # held back
    tab.goto(served.url + "experiments/many")
    tab.wait_for_selector(ROW, timeout=30_000)
    assert held, "the page asked for importance"
    assert tab.get_by_text("computing hyperparameter importance").count() == 1
    rows = tab.locator(ROW)
    assert rows.count() == 100  # one page of the 1,100 trials
    for column in ("start", "duration"):
        assert tab.get_by_role("columnheader", name=column, exact=True).count() == 1
    assert "page 1 of 11" in tab.locator(".pager").inner_text()
    tab.locator(".pager button", has_text="›").click()
    tab.wait_for_selector(".pager >> text=page 2 of 11")
    assert rows.count() == 100
    tab.locator("input.table-filter").fill("1077")
    tab.wait_for_selector(".table-bar >> text=/ of 1100 rows/")
    kept = rows.all_inner_texts()
    assert 1 <= len(kept) < 100 and all("1077" in r for r in kept), kept
    held[0].continue_()  # now the importance chart replaces its placeholder
    tab.wait_for_selector("main svg[aria-label*='importance']", timeout=30_000)
    assert tab.get_by_text("computing hyperparameter importance").count() == 0
    assert rows.all_inner_texts() == kept  # the filter survived the page drawn again
    assert tab.evaluate("document.activeElement.classList.contains('table-filter')")
