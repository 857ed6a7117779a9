"""Pages redrawn every second keep what the user did (issue 36 §2): the selected text (a table
cell, a hyperparameter, a log line), the scroll of a scrolling box (the trial table's card, the
log) and a chart's zoom, while the data grow under them (core.js's fill/patch redraw in place;
charts are kept nodes). And a plain run's page has its System section. One server and one
chromium tab for the module, on _ui_helpers' trees."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from determined_launch.core._rundir import RunDir
from tests._ui_helpers import NAME, Served, browsing, make_experiment, make_run, playwright_or_skip

pytest.importorskip("optuna")
sync_api = playwright_or_skip()
expect = sync_api.expect
TICK_MS = 1300  # one more poll of the page's loop (each second)
SELECTED = "() => [getSelection().toString(), !!getSelection().anchorNode?.isConnected]"


def _profile(node: int, t: float, cpu: float) -> str:
    return json.dumps({"time": t, "node": node, "host": f"h{node}", "cpu": {"cpu_util_simple": cpu},
                       "memory": {"memory_percent": 50.0}}) + "\n"


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Any, pathlib.Path]]:
    root = tmp_path_factory.mktemp("keep")
    exp = make_experiment(root / "det_experiments")
    run = make_run(root / "det_runs")
    (run / "profiler.jsonl").write_text(_profile(0, 1.0, 20.0) + _profile(0, 11.0, 40.0))
    _log(exp, range(200))  # the trial's log box scrolls
    with browsing(cwd=root, viewport={"width": 800, "height": 700}) as (served, page):
        yield served, page, exp


def _log(exp: pathlib.Path, lines: range) -> None:
    with (exp / "trials" / "4" / "output.log").open("a") as f:
        f.write("".join(f"[rank=0] line {i}\n" for i in lines))


def _select(locator: Any, text: str) -> None:
    """Selects ``text`` inside the element (its first text node holding it), as a user's drag."""
    got = locator.evaluate("""(el, text) => {
        const w = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
        while (w.nextNode() && !w.currentNode.data.includes(text));
        const node = w.currentNode, at = node.data.indexOf(text), r = document.createRange();
        r.setStart(node, at); r.setEnd(node, at + text.length);
        getSelection().removeAllRanges(); getSelection().addRange(r);
        return getSelection().toString(); }""", text)
    assert got == text


def _report(exp: pathlib.Path, step: int, loss: float) -> None:
    """Trial 4 (running) reports its searcher metric into the study."""
    import optuna

    from determined_launch.experiment import searchers as se

    storage = se.open_storage(None, str(exp / "study.journal"))
    trial = optuna.load_study(study_name=NAME, storage=storage).trials[3]
    storage.set_trial_intermediate_value(trial._trial_id, step, loss)


def test_the_experiment_page_keeps_selection_scroll_and_zoom(
        ui: tuple[Served, Any, pathlib.Path]) -> None:
    served, page, exp = ui
    page.goto(f"{served.url}experiments/{NAME}")
    row = page.locator("main table.data-table tbody tr",
                       has=page.locator("a", has_text=re.compile("^4$")))
    expect(row).to_contain_text("1.5")  # trial 4's latest loss
    chart = page.locator(".uchart[data-key=experiment]")
    # the user zooms the chart, scrolls the wide trial table's card and selects a cell
    chart.evaluate("el => { el.mark = 1; el.uplot.setScale('x', {min: 30, max: 80}); }")
    card = page.locator(".card", has=page.locator("table.data-table"))
    assert card.evaluate("el => el.scrollWidth > el.clientWidth"), "the table fits: no scroll"
    card.evaluate("el => { el.scrollLeft = 40; }")
    page.evaluate("window.scrollTo(0, 150)")
    _select(row.locator("td", has_text=re.compile(r"^0\.02$")), "0.02")
    _report(exp, 30, 1.25)  # the running trial reports: the page draws it, then polls again
    expect(row).to_contain_text("1.25")
    page.wait_for_timeout(TICK_MS)
    assert page.evaluate(SELECTED) == ["0.02", True]
    assert card.evaluate("el => el.scrollLeft") == 40
    assert page.evaluate("scrollY") == 150
    # the chart is the same node and uPlot, has the new point, and keeps the user's zoom
    assert chart.evaluate("el => [el.mark, el.uplot.data[0].includes(30), "
                          "el.uplot.scales.x.min, el.uplot.scales.x.max]") == [1, True, 30, 80]


def test_a_brush_dragged_while_the_page_redraws(ui: tuple[Served, Any, pathlib.Path]) -> None:
    served, page, exp = ui
    page.goto(f"{served.url}experiments/{NAME}")
    links = page.locator(f"main td a[href*='/experiments/{NAME}/trials/']")
    expect(links).to_have_count(4)
    # Scrolled to and measured in one step in the page (a poll tick may draw the axes again
    # between two steps: a new grip in the same place, the old one detached), until two
    # measures agree: sections still loading above (importance, charts) move it down.
    grip = page.locator("rect.axis-grip[data-axis=loss]")
    measure = ("el => { el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
               " return {x: r.x, y: r.y, width: r.width, height: r.height}; }")
    box, before = grip.evaluate(measure), None
    while box != before:
        page.wait_for_timeout(300)
        before, box = box, grip.evaluate(measure)
    x = box["x"] + box["width"] / 2
    page.mouse.move(x, box["y"] + box["height"] - 2)  # the metric axis' low end ...
    page.mouse.down()
    page.mouse.move(x, box["y"] + box["height"] * 0.7, steps=4)
    _report(exp, 40, 1.1)  # ... while trial 4 reports and the page redraws
    expect(page.locator("main table.data-table")).to_contain_text("1.1")
    page.wait_for_timeout(TICK_MS)
    assert page.locator("svg rect.brush").count() == 1  # the band being dragged
    page.mouse.up()  # losses 0.5 (trial 1), 1.1 (4), 3.0 (2): the low third keeps 1 and 4
    expect(links).to_have_text(["1", "4"])


def test_the_trial_page_keeps_selection_and_log_scroll(
        ui: tuple[Served, Any, pathlib.Path]) -> None:
    served, page, exp = ui
    page.goto(f"{served.url}experiments/{NAME}/trials/4")
    logs = page.locator("pre.logs:not(.tail)")
    expect(logs).to_contain_text("line 199")
    steps = page.locator("dt:text-is('steps completed') + dd")
    run = RunDir(exp / "trials" / "4", trial_id=4)
    logs.evaluate("el => { el.scrollTop = 200; }")  # the user reads back in the log
    hparam = page.locator("dd", has_text=re.compile(r"^0\.02$"))
    for step, where, text in ((40, hparam, "0.02"), (50, logs, "line 50")):
        _select(where, text)
        run.append("training", {"steps_completed": step, "metrics": {"loss": 1.0 / step}})
        _log(exp, range(200 + step, 201 + step))
        expect(steps).to_have_text(str(step))  # the facts were drawn again
        expect(logs).to_contain_text(f"line {200 + step}")
        page.wait_for_timeout(TICK_MS)
        assert page.evaluate(SELECTED) == [text, True], step
        assert logs.evaluate("el => el.scrollTop") == 200, step


def test_a_plain_run_has_a_system_section(ui: tuple[Served, Any, pathlib.Path]) -> None:
    served, page, _ = ui
    page.goto(f"{served.url}runs/local")
    section = page.locator("#system")
    expect(section).to_contain_text("node 0 (h0), 2 reports")
    cells = section.locator("table.system tr", has_text="CPU %").locator("td")
    expect(cells).to_have_text(["CPU %", "40", "30"])  # latest, mean
    expect(section.locator(".uchart")).to_have_count(1)  # CPU and memory %
