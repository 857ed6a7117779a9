"""det-launch ui in a real browser (Debian's chromium driven by Playwright), on a
real experiment that runs while the pages follow it. Takes the screenshots that
docs/ui.md shows: into the test's directory, and into docs/images/ui-*.png with
``DET_UI_SCREENSHOTS=1`` (so a test run never changes the tracked tree)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests._ui_helpers import ARGS, CHROMIUM, Served, chromium, playwright_or_skip

pytest.importorskip("optuna")
playwright = playwright_or_skip()
__all__ = ["ARGS", "CHROMIUM"]  # test_ui_states imports them from here
DOCS_IMAGES = pathlib.Path(__file__).resolve().parent.parent / "docs" / "images"

CONFIG = """\
name: ui-demo
entrypoint: python3 train.py
hyperparameters:
  lr: {type: log, minval: -3, maxval: -1}
  width: {type: categorical, vals: [32, 64]}
searcher:
  name: random
  metric: loss
  smaller_is_better: true
  max_length: 40
  max_trials: 2
  max_concurrent_trials: 2
max_restarts: 0
reproducibility:
  experiment_seed: 3
"""

TRAIN = """\
import json, math, pathlib, time
import determined_launch as det
from determined_launch import core

hp = det.get_cluster_info().trial.hparams
with core.init() as ctx:
    for step in range(1, 41):
        time.sleep(0.02)
        loss = (math.log10(hp["lr"]) + 2) ** 2 + 4.0 / step + (hp["width"] == 32)
        ctx.train.report_training_metrics(step, {"loss": loss + 0.1})
        if step % 10 == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
            ctx.train.report_validation_metrics(step, {"loss": loss})
        if step == 20:
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                (pathlib.Path(path) / "state.json").write_text(json.dumps({"step": step}))
                (pathlib.Path(path) / "weights.bin").write_bytes(bytes(40 * 1024))
"""


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b


def test_pages_follow_a_real_experiment(tmp_path: pathlib.Path, browser: object) -> None:
    IMAGES = DOCS_IMAGES if os.environ.get("DET_UI_SCREENSHOTS") == "1" else tmp_path  # noqa: N806
    (tmp_path / "exp.yaml").write_text(CONFIG)
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    exp = subprocess.Popen([sys.executable, "-m", "determined_launch.cli", "experiment",
                            "exp.yaml"], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    (tmp_path / "det_experiments").mkdir(exist_ok=True)
    ui = Served(cwd=tmp_path)
    expect = playwright.expect
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
        page.goto(ui.url)
        # The experiment appears, runs and completes while the page stays open (no reload).
        expect(page.get_by_role("link", name="ui-demo")).to_be_visible(timeout=20_000)
        page.get_by_role("link", name="ui-demo").click()
        expect(page.locator("td a", has_text=re.compile(r"^2$"))).to_be_visible(timeout=20_000)
        assert exp.wait(timeout=60) == 0, exp.stdout.read() if exp.stdout else ""
        expect(page.locator("tbody tr .state.completed")).to_have_count(2, timeout=5_000)
        trials = ui.json("/api/v1/experiments/ui-demo/trials")
        best = ui.json("/api/v1/experiments/ui-demo")["best_trial"]
        lr = trials[0]["hparams"]["lr"]
        expect(page.locator(".card tbody")).to_contain_text(str(float(f"{lr:.6g}")))
        expect(page.locator(".uchart canvas").first).to_be_visible()  # uPlot (charts.js)
        assert page.locator("svg polyline.series").count() == 2  # parallel coordinates
        page.screenshot(path=str(IMAGES / "ui-experiment.png"), full_page=True)

        page.goto(ui.url)
        expect(page.locator("table").first).to_contain_text("completed")
        expect(page.locator("table").first).to_contain_text(f"trial {best['trial_id']}")
        page.screenshot(path=str(IMAGES / "ui-home.png"))

        tid = best["trial_id"]
        page.goto(f"{ui.url}experiments/ui-demo/trials/{tid}")
        [ck] = ui.json(f"/api/v1/experiments/ui-demo/trials/{tid}/checkpoints")
        expect(page.locator("td code", has_text=ck["uuid"])).to_be_visible(timeout=5_000)
        expect(page.locator("pre.logs").last).to_contain_text("step 40 loss")
        expect(page.locator(".uchart .u-title", has_text="training: loss")).to_be_visible()
        expect(page.locator(".uchart .u-title", has_text="validation: loss")).to_be_visible()
        value = f"{best['value']:.6g}"
        expect(page.locator("dl.kv").first).to_contain_text(str(float(value)))
        facts = page.locator("dl.kv").first
        expect(facts).to_contain_text("exit status 0")  # the launcher's summary line
        expect(facts).to_contain_text("job succeeded on 1 node")
        expect(page.locator("td", has_text=re.compile(r"^40\.\d KiB$"))).to_be_visible()
        logs = page.locator("select.ranks")
        expect(logs).to_have_value("")  # all output: exec labels no ranks, nothing to filter
        expect(logs).to_contain_text("not labelled by rank")
        expect(logs).to_be_disabled()
        expect(facts).to_contain_text("completed at length 40")
        page.screenshot(path=str(IMAGES / "ui-trial.png"), full_page=True)

        page.goto(f"{ui.url}compare?items=exp:ui-demo:1,exp:ui-demo:2&group=validation")
        legend = page.locator(".uchart .u-legend .u-series")  # steps and one line each
        expect(legend).to_have_count(3, timeout=5_000)
        expect(page.locator("table.side-by-side")).to_contain_text("final validation: loss")
        page.screenshot(path=str(IMAGES / "ui-compare.png"))
        assert (IMAGES / "ui-trial.png").stat().st_size > 10_000  # a page, not a blank
    finally:
        if exp.poll() is None:
            exp.terminate()
            exp.wait(timeout=30)
        if exp.stdout:
            exp.stdout.close()
        ui.stop()
