"""The trial page's System section, server side (ui/system.py)."""

from __future__ import annotations

import json
import pathlib

from determined_launch.ui import system


def _line(node: int, t: float, cpu: float, **gpu: float) -> str:
    return json.dumps({"time": t, "node": node, "host": f"h{node}", "cpu": {"cpu_util_simple": cpu},
                       "memory": {"free_memory": 4.0, "memory_percent": 50.0}, "gpu": gpu}) + "\n"


def test_per_node_latest_mean_and_series_from_a_bounded_tail(tmp_path: pathlib.Path) -> None:
    (tmp_path / "profiler.jsonl").write_text(
        _line(1, 1.0, 10.0, gpu_util_0=90.0) + _line(0, 1.0, 20.0)
        + '{"torn": \n' + json.dumps({"time": 2.0, "node": 0, "cpu": {"cpu_util_simple": "x",
                                                                      "nan": float("nan")}}) + "\n"
        + _line(0, 3.0, 40.0) + _line(1, 3.0, 30.0, gpu_util_0=70.0)
        + '{"time": 4.0, "node": 0, "cpu": {"cpu_util_simple": 1')  # still being written
    nodes = system.system(str(tmp_path), [str(tmp_path)])["nodes"]
    assert [(n["node"], n["host"], n["samples"]) for n in nodes] == [(0, "h0", 3), (1, "h1", 2)]
    zero, one = nodes
    assert zero["latest"]["cpu_util_simple"] == 40.0 and zero["mean"]["cpu_util_simple"] == 30.0
    assert zero["time"] == [1.0, 2.0, 3.0]
    assert zero["series"]["cpu_util_simple"] == [20.0, None, 40.0]
    assert "gpu_util_0" not in zero["names"] and one["mean"]["gpu_util_0"] == 80.0
    assert one["latest"] == {"cpu_util_simple": 30.0, "free_memory": 4.0, "memory_percent": 50.0,
                             "gpu_util_0": 70.0}


def test_no_stream_and_a_stream_outside_the_roots_give_no_nodes(tmp_path: pathlib.Path) -> None:
    assert system.system(str(tmp_path), [str(tmp_path)]) == {"nodes": []}
    (tmp_path / "profiler.jsonl").write_text(_line(0, 1.0, 5.0))
    assert system.system(str(tmp_path), [str(tmp_path / "elsewhere")]) == {"nodes": []}
    assert len(system.system(str(tmp_path), [str(tmp_path)])["nodes"]) == 1


def test_points_are_capped_per_node() -> None:
    records = [{"time": float(i), "node": 0, "cpu": {"cpu_util_simple": float(i)}}
               for i in range(system.MAX_POINTS + 50)]
    (node,) = system.summarize(records)
    assert len(node["time"]) == system.MAX_POINTS and node["time"][-1] == system.MAX_POINTS + 49
    assert node["samples"] == system.MAX_POINTS + 50


def test_the_trial_page_shows_each_nodes_system_metrics(tmp_path: pathlib.Path) -> None:
    """The API row and the page's System section, in Debian's chromium (one page load)."""
    import pytest

    pytest.importorskip("optuna")
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests._ui_helpers import Served, chromium, make_experiment, playwright_or_skip

    exp = make_experiment(tmp_path / "det_experiments")
    (exp / "trials" / "1" / "profiler.jsonl").write_text(
        _line(0, 1.0, 20.0, gpu_util_0=90.0, gpu_memory_percent_0=40.0)
        + _line(0, 11.0, 40.0, gpu_util_0=70.0, gpu_memory_percent_0=50.0) + _line(1, 5.0, 7.0))
    ui = Served(cwd=tmp_path)
    try:
        nodes = ui.json(f"/api/v1/experiments/{exp.name}/trials/1/system")["nodes"]
        assert [(n["node"], n["latest"]["cpu_util_simple"]) for n in nodes] == [(0, 40.0), (1, 7.0)]
        assert ui.json(f"/api/v1/experiments/{exp.name}/trials/2/system") == {"nodes": []}
        playwright_or_skip()
        with chromium() as browser:
            page = browser.new_page()
            page.goto(f"{ui.url}experiments/{exp.name}/trials/1")
            section = page.locator("#system")
            sync_api.expect(section).to_contain_text("node 0 (h0)", timeout=15_000)
            sync_api.expect(section).to_contain_text("node 1 (h1)")
            first = section.locator(".system-node").first
            row = first.locator("table.system tr", has_text="GPU 0 util %")
            sync_api.expect(row.locator("td")).to_have_text(["GPU 0 util %", "70", "80"])
            # CPU and memory, GPU utilisation, GPU memory; node 1 has one sample: no chart
            sync_api.expect(first.locator(".chart")).to_have_count(3)
            assert section.locator(".system-node").nth(1).locator(".chart").count() == 0
    finally:
        ui.stop()
