"""det-launch ui's charts in a real browser (Debian's chromium, Playwright): the
value under the pointer, zoom/reset and log scale, the parallel coordinates'
brush filtering the trial list, any metric of any group. One server and one
browser for the module, on test_ui_charts' fixture tree (no experiment runs).
With ``DET_UI_SCREENSHOTS=1`` the screenshots go to docs/images/."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests._ui_helpers import NAME, Served, browsing, playwright_or_skip
from tests.test_ui_charts import _with_custom_group

pytest.importorskip("optuna")
playwright = playwright_or_skip()
DOCS_IMAGES = pathlib.Path(__file__).resolve().parent.parent / "docs" / "images"


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Any]]:
    with browsing(str(_with_custom_group(tmp_path_factory.mktemp("charts")))) as served_page:
        yield served_page


def _images(tmp: pathlib.Path) -> pathlib.Path:
    return DOCS_IMAGES if os.environ.get("DET_UI_SCREENSHOTS") == "1" else tmp


def _chart(page: Any, title: str) -> Any:
    chart = page.locator(".uchart", has=page.locator(".u-title", has_text=title))
    playwright.expect(chart).to_be_visible(timeout=10_000)
    return chart


def _scale(chart: Any, axis: str) -> list[float]:
    return chart.evaluate(f"el => [el.uplot.scales.{axis}.min, el.uplot.scales.{axis}.max, "
                          f"el.uplot.scales.{axis}.distr]")


def test_the_legend_shows_the_value_under_the_pointer(ui: tuple[Served, Any]) -> None:
    served, page = ui
    page.goto(f"{served.url}experiments/{NAME}/trials/1")
    chart = _chart(page, "training: loss")
    over = chart.locator(".u-over")
    box = over.bounding_box()
    over.hover(position={"x": box["width"] * 0.5, "y": box["height"] / 2})
    step_cell, value_cell = chart.locator(".u-legend .u-series .u-value").all()[:2]
    step = int(step_cell.inner_text())
    assert step in range(10, 101, 10) and 30 <= step <= 70  # the point under the pointer
    # the API's point at that step (make_experiment: training loss = 1/step)
    [row] = [r for r in served.json(f"/api/v1/experiments/{NAME}/trials/1/metrics?group=training")
             if r["steps_completed"] == step]
    assert float(value_cell.inner_text()) == pytest.approx(row["metrics"]["loss"], rel=1e-5)


def test_drag_zooms_double_click_resets_and_log_scale(ui: tuple[Served, Any],
                                                     tmp_path: pathlib.Path) -> None:
    served, page = ui
    page.goto(f"{served.url}experiments/{NAME}/trials/1")
    chart = _chart(page, "training: loss")
    assert _scale(chart, "x")[:2] == [10, 100]
    over = chart.locator(".u-over")
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.2, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=5)
    page.mouse.up()
    lo, hi, _ = _scale(chart, "x")
    assert 20 < lo < hi < 70  # the dragged span, about 28..64
    page.wait_for_timeout(1500)  # a poll later the zoom is kept
    assert _scale(chart, "x")[:2] == [lo, hi]
    over.dblclick()
    assert _scale(chart, "x")[:2] == [10, 100]
    assert _scale(chart, "y")[2] == 1
    chart.locator("input.log").check()
    chart = _chart(page, "training: loss")
    assert _scale(chart, "y")[2] == 3  # uPlot's log distribution
    page.screenshot(path=str(_images(tmp_path) / "ui-charts-trial.png"))


def test_the_parallel_brush_filters_the_trial_list(ui: tuple[Served, Any],
                                                   tmp_path: pathlib.Path) -> None:
    served, page = ui
    expect = playwright.expect
    page.goto(f"{served.url}experiments/{NAME}")
    link = page.locator(f"a[href*='/experiments/{NAME}/trials/']")
    expect(link).to_have_count(4, timeout=10_000)
    # the groups' names come after the first paint (and redraw the charts): wait for them
    expect(page.locator("select.metric-pick option", has_text="bleu")).to_have_count(1)
    # metric axis: loss 0.5 (trial 1) .. 3.0 (trial 2), linear; keep the lowest third
    grip = page.locator("rect.axis-grip[data-axis=loss]")
    grip.scroll_into_view_if_needed()
    box = grip.bounding_box()
    x = box["x"] + box["width"] / 2
    page.mouse.move(x, box["y"] + box["height"] - 2)  # the grip reaches past the axis' end
    page.mouse.down()
    page.mouse.move(x, box["y"] + box["height"] * 0.7, steps=4)
    page.mouse.up()
    expect(link).to_have_count(1)
    expect(link).to_have_text("1")
    expect(page.locator("polyline.series.out")).to_have_count(2)  # trials 2 and 4, greyed
    # any metric of any group: a user's report_metrics group
    page.locator("select.metric-pick").select_option(label="bleu")
    chart = _chart(page, "eval_extra: bleu")
    assert chart.evaluate("el => el.uplot.data.length") == 1 + 4  # x and 4 trials' series
    page.screenshot(path=str(_images(tmp_path) / "ui-charts-experiment.png"), full_page=True)
    page.mouse.click(x, box["y"] + box["height"] * 0.2)  # a click on the axis clears it
    expect(link).to_have_count(4)
