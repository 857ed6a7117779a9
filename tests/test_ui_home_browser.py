"""det-launch ui's home page in Chromium: each experiment's progress, the filter box, and
redraws that keep the user's text selection, focus and scroll."""

from __future__ import annotations

import pathlib

import pytest

from tests._ui_helpers import NAME, browsing, make_experiment, make_run, playwright_or_skip

pytest.importorskip("optuna")
playwright_or_skip()


@pytest.mark.slow
def test_home_shows_progress_filters_and_keeps_selection(tmp_path: pathlib.Path) -> None:
    make_experiment(tmp_path / "det_experiments")  # 4 trials of 4: 3 done, 1 running
    make_run(tmp_path / "det_runs")
    with browsing(cwd=tmp_path, viewport={"width": 900, "height": 300}) as (served, tab):
        tab.goto(served.url)
        tab.wait_for_selector("span.progress")
        assert tab.inner_text("span.progress").strip() == "3/4"
        assert tab.get_attribute("span.progress progress", "value") == "3"
        # the user selects an experiment's name and scrolls; a redraw changes neither
        tab.evaluate("""() => {
            document.body.style.minHeight = '3000px'; window.scrollTo(0, 120);
            getSelection().selectAllChildren(document.querySelector('tbody a')); }""")
        tab.evaluate("rerender()")
        tab.wait_for_timeout(1300)  # a poll of the loop too
        assert tab.evaluate("getSelection().toString()") == NAME
        assert tab.evaluate("getSelection().anchorNode.isConnected")
        assert tab.evaluate("scrollY") == 120
        # the filter: typed text and focus live across the redraws it causes
        box = tab.locator("input.home-filter")
        box.click()
        box.type("local")
        tab.locator("span.progress").wait_for(state="detached")  # (CSP: no polled JS)
        assert "No experiments match" in tab.inner_text("main")
        assert tab.locator("a[href='/runs/local']").count() == 1
        tab.wait_for_timeout(1300)
        assert tab.evaluate("document.activeElement.classList.contains('home-filter')")
        assert box.input_value() == "local"
        box.fill("running")  # by state: the running experiment, not the finished run
        tab.wait_for_selector("span.progress")
        assert tab.locator("a[href='/runs/local']").count() == 0
