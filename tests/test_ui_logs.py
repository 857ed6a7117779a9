"""det-launch ui's logs and run notes (issue 36 §1, §4; issue 35 §3): a text
search in a log, server-side and bounded; the slow ranks the launcher recorded."""

from __future__ import annotations

import pathlib

import pytest

from determined_launch import rundir
from determined_launch.supervisor.stragglers import Change
from determined_launch.supervisor.watchdog import record_straggler
from determined_launch.ui import run_logs
from determined_launch.ui.run_logs import RunLogs
from tests._ui_helpers import SECRET, Served


def _run(root: pathlib.Path, text: str) -> pathlib.Path:
    run = root / "det_runs" / "local"
    run.mkdir(parents=True)
    (run / "output.log").write_text(text)
    rundir.record_exit(run, 1, 100.0)  # a run the catalog lists
    return run


def test_log_search_is_the_servers(tmp_path: pathlib.Path) -> None:
    filler = "".join(f"[rank={i % 2}] step {i} fine\n" for i in range(50_000))  # > 1 MiB
    text = ("[rank=1] Error: early one, over a MiB before the end\n" + filler
            + f"[rank=0] db password={SECRET} error here\n"
            + "[rank=0] ERROR: late\n[rank=1] an error of rank 1\n")
    run = _run(tmp_path, text)
    assert len(text) > run_logs.LOG_LIMIT
    s = Served(str(tmp_path / "det_runs"), cwd=tmp_path)
    try:
        status, headers, body = s.get("/api/v1/runs/local/logs?q=eRRor")
        assert status == 200
        assert body.decode().splitlines() == [
            "[rank=1] Error: early one, over a MiB before the end",
            "[rank=0] db password=*** error here",
            "[rank=0] ERROR: late", "[rank=1] an error of rank 1"]
        assert int(headers["X-Log-Offset"]) == run.joinpath("output.log").stat().st_size
        assert s.get("/api/v1/runs/local/logs?q=error&rank=1")[2].decode().splitlines() == [
            "[rank=1] Error: early one, over a MiB before the end",
            "[rank=1] an error of rank 1"]
        # a search never tells a secret the page masks
        assert s.get(f"/api/v1/runs/local/logs?q={SECRET}")[2] == b""
        # following: from an offset, only what was appended and matches
        end = headers["X-Log-Offset"]
        with open(run / "output.log", "a") as f:
            f.write("[rank=0] ok\n[rank=0] another error\n")
        assert s.get(f"/api/v1/runs/local/logs?q=error&offset={end}")[2] == (
            b"[rank=0] another error\n")
    finally:
        s.stop()


def test_log_search_is_bounded(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_logs, "SEARCH_BYTES", 64 << 10)
    monkeypatch.setattr(run_logs, "SEARCH_LINES", 100)
    run = _run(tmp_path, "hit: too old to be searched\n"
               + "".join(f"line {i} hit\n" for i in range(20_000)))
    reader = RunLogs([str(tmp_path)])
    text, end = reader.logs(str(run), None, None, limit=4096, search="HIT")
    lines = text.splitlines()
    assert lines == [f"line {i} hit" for i in range(19_900, 20_000)]  # the newest, at most 100
    assert end == (run / "output.log").stat().st_size
    # the whole 64 KiB window was read, a 4 KiB chunk at a time, older lines were not
    few = reader.logs(str(run), None, None, limit=4096, search="too old")
    assert few == ("", end)


def test_stragglers_of_a_trial_and_a_run(tmp_path: pathlib.Path) -> None:
    run = _run(tmp_path, "[rank=0] x\n")
    record_straggler(str(run), Change(3, True, 0.42, 0.1), 1, "h1", 100.0)
    record_straggler(str(run), Change(2, True, 0.5, 0.1), 0, "h0", 101.0)
    record_straggler(str(run), Change(2, False, 0.11, 0.1), 0, "h0", 130.0)
    (run / "stragglers.jsonl").open("a").write('{"rank": "x"}\nnot json\n')
    from determined_launch.ui.api import Api

    one = Api([str(tmp_path / "det_runs")]).run_pages.run("local") or {}
    now, events = one["stragglers"]["now"], one["stragglers"]["events"]
    assert [(e["node"], e["rank"], e["host"], e["step_time"], e["median"]) for e in now] == [
        (1, 3, "h1", 0.42, 0.1)]
    assert [(e["rank"], e["straggler"], e["time"]) for e in events] == [
        (3, True, 100.0), (2, True, 101.0), (2, False, 130.0)]


def test_the_experiment_table_marks_a_straggling_trial(tmp_path: pathlib.Path) -> None:
    from determined_launch.experiment.report import slow_ranks

    assert slow_ranks(tmp_path) == ""
    record_straggler(str(tmp_path), Change(3, True, 0.42, 0.1), 1, "h1", 100.0)
    record_straggler(str(tmp_path), Change(5, True, 0.5, 0.1), 0, "h0", 101.0)
    assert slow_ranks(tmp_path) == ", straggler: rank 5 (node 0), rank 3 (node 1)"
    record_straggler(str(tmp_path), Change(5, False, 0.11, 0.1), 0, "h0", 130.0)
    assert slow_ranks(tmp_path) == ", straggler: rank 3 (node 1)"


@pytest.mark.slow
def test_the_trial_page_searches_its_log_and_shows_checkpoints_and_slow_ranks(
        tmp_path: pathlib.Path) -> None:

    from tests._ui_helpers import NAME, chromium, make_experiment, playwright_or_skip

    sync_api = playwright_or_skip()
    pytest.importorskip("optuna")

    exp = make_experiment(tmp_path / "det_experiments")
    trial = exp / "trials" / "1"
    with open(trial / "output.log", "a") as f:
        f.write("".join(f"[rank=0] step {i} ok\n" for i in range(300)) + "[rank=1] CUDA error: x\n")
    record_straggler(str(trial), Change(3, True, 0.42, 0.1), 1, "h1", 100.0)
    s = Served(cwd=tmp_path)
    try:
        with chromium() as browser:
            page = browser.new_page()
            page.goto(f"{s.url}experiments/{NAME}/trials/1")
            logs = page.locator("pre.logs").last
            sync_api.expect(logs).to_contain_text("step 299 ok", timeout=10_000)
            box = page.locator("input.log-search")
            box.fill("cuda ERROR")
            sync_api.expect(logs).to_have_text("[rank=1] CUDA error: x\n", timeout=5_000)
            with open(trial / "output.log", "a") as f:
                f.write("[rank=0] step 300 ok\n[rank=0] another cuda error\n")
            sync_api.expect(logs).to_contain_text("another cuda error", timeout=5_000)
            page.wait_for_timeout(1500)  # redraws: the search and its answer stay
            assert box.input_value() == "cuda ERROR"
            assert "step 300" not in logs.inner_text()
            # the checkpoint's metadata (redacted) and the slow rank
            sync_api.expect(page.locator(".ck-meta")).to_contain_text("aws_secret_access_key=")
            assert SECRET not in page.content()
            sync_api.expect(page.locator("dl.kv").first).to_contain_text("rank 3 on node 1 (h1)")
            sync_api.expect(page.locator("td", has_text="became a straggler")).to_be_visible()
    finally:
        s.stop()
