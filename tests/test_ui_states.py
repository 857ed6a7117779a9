"""det-launch ui tells what happened (issue 36 §1): a trial the searcher stopped
is no preemption, a crashed plain run is errored, an unknown page says so and
stops asking; and the pages' kill and activate actions (§4) under pause's rules."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests._ui_helpers import NAME, Served, make_experiment

pytest.importorskip("optuna")

PAIR = ("det-launch: the launcher saw the preemption file /x/preempt; asking workers to "
        "checkpoint and exit\n"
        "det-launch: job preempted after the workers acknowledged; resumable (exit status 75)\n")


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    exp = make_experiment(tmp_path / "det_experiments")
    # trial 2: paused from the WebUI, resumed, then stopped by ASHA (the driver's stop_reason)
    (exp / "trials" / "2" / "output.log").write_text(
        "[rank=0] one\n" + PAIR + "[rank=0] resumed\n" + PAIR)
    (exp / "trials" / "2" / "stop_reason.json").write_text('{"reason": "pruned"}')
    # trial 1 completed: the driver stopped it at the searcher's length (reason "done")
    (exp / "trials" / "1" / "stop_reason.json").write_text('{"reason": "done"}')
    (exp / "trials" / "3" / "output.log").write_text("plain line, no rank label\n")
    return tmp_path


@pytest.fixture
def served(tree: pathlib.Path) -> Iterator[Served]:
    s = Served(cwd=tree)
    yield s
    s.stop()


def test_a_trial_the_searcher_stopped_is_not_preempted(served: Served, tree: pathlib.Path
                                                       ) -> None:
    one = served.json(f"/api/v1/experiments/{NAME}/trials/1")
    two = served.json(f"/api/v1/experiments/{NAME}/trials/2")
    for t in (one, two):  # what the page shows: no exit status 75, no "resumable"
        last = t["history"][-1]
        assert t["exit_status"] != 75 and last.get("exit_status") != 75
        # the words, not the numbers: a timestamp may well contain the digits 75
        shown = json.dumps([t["ended"], t["outcome"], last.get("text"), last.get("kind")])
        assert re.search(r"\b75\b", shown) is None, shown
        assert "resumable" not in shown and "preempt" not in shown, shown
    assert one["ended"] == "completed at length 100" and one["exit_status"] is None
    assert two["ended"] == "stopped by the searcher (ASHA) at length 25"
    # each event once, in words: the pause, then the searcher's stop (not two identical pairs)
    assert [e["kind"] for e in two["history"]] == ["paused", "searcher"]
    assert two["history"][0]["text"].startswith("paused")
    log = tree / "det_experiments" / NAME / "trials" / "2" / "output.log"
    assert two["history"][-1]["time"] == pytest.approx(log.stat().st_mtime)
    # Optuna's number beside the root-wide id (optuna-dashboard's "Trial 1" is id 2 here)
    assert two["optuna_number"] == 1
    rows = served.json(f"/api/v1/experiments/{NAME}/trials")
    assert [r["optuna_number"] for r in rows] == [0, 1, 2, 3]
    # the rank filter offers the ranks the log labels; exec's unlabelled output has none
    assert two["log_ranks"] == [0]
    assert served.json(f"/api/v1/experiments/{NAME}/trials/1")["log_ranks"] == [0, 1]
    assert served.json(f"/api/v1/experiments/{NAME}/trials/3")["log_ranks"] == []


def test_history_events_get_their_times_while_followed(tree: pathlib.Path) -> None:
    from determined_launch.ui.api import Api

    log = tree / "det_experiments" / NAME / "trials" / "1" / "output.log"
    api = Api([str(tree / "det_experiments")])
    first = (api.trial(NAME, 1) or {})["history"]
    assert [e["kind"] for e in first] == ["searcher"]  # the log ends with it: its mtime
    assert first[0]["time"] == pytest.approx(log.stat().st_mtime)
    time.sleep(0.05)
    with open(log, "a") as f:  # resumed, then paused again: found while following
        f.write("[rank=0] resumed\n" + PAIR)
    later = (api.trial(NAME, 1) or {})["history"]
    assert [e["kind"] for e in later] == ["paused", "searcher"]
    assert later[0]["time"] == pytest.approx(first[0]["time"])
    assert later[1]["time"] == pytest.approx(log.stat().st_mtime)
    assert later[1]["time"] > later[0]["time"]


def test_a_crashed_plain_run_is_errored(tmp_path: pathlib.Path) -> None:
    (tmp_path / "crash.py").write_text("print('about to crash')\nraise RuntimeError('boom')\n")
    done = subprocess.run([sys.executable, "-m", "determined_launch.cli", "exec", "--",
                           sys.executable, "crash.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    s = Served(str(tmp_path / "det_runs"), cwd=tmp_path)
    try:
        [run] = s.json("/api/v1/runs")
        assert run["name"] == "local" and run["state"] == "errored"
        one = s.json("/api/v1/runs/local")
        assert one["exit_status"] == 1 and one["ended"] == "errored (exit status 1)"
        # its own output: the exception, kept by the launcher in the run directory
        assert "RuntimeError: boom" in one["output_tail"], one["output_tail"]
        assert "about to crash" in s.get("/api/v1/runs/local/logs")[2].decode()
    finally:
        s.stop()
    # ... while the launcher's own streams still got all of it
    assert "about to crash" in done.stdout and "RuntimeError: boom" in done.stderr
    # run again, it succeeds: the last job's record is the one shown
    (tmp_path / "crash.py").write_text("print('fine')\n")
    subprocess.run([sys.executable, "-m", "determined_launch.cli", "exec", "--",
                    sys.executable, "crash.py"], cwd=tmp_path, capture_output=True, timeout=60,
                   check=True)
    record = json.loads((tmp_path / "det_runs" / "local" / "exit.json").read_text())
    assert record["exit_status"] == 0


def test_a_failed_trial_shows_the_end_of_its_output(tree: pathlib.Path) -> None:
    from determined_launch.ui.api import Api

    exp = tree / "det_experiments" / NAME
    _set_attr(exp, 3, "det_failed", True)  # the running one: its worker raised
    (exp / "trials" / "4" / "output.log").write_text(
        "[rank=0] Traceback (most recent call last):\n[rank=0] ValueError: bad batch\n"
        "det-launch: job failed: rank 0 exited with status 1 first; exit status 1\n")
    four = Api([str(tree / "det_experiments")]).trial(NAME, 4) or {}
    assert four["state"] == "failed" and four["ended"] == "errored (exit status 1)"
    assert four["output_tail"].endswith("ValueError: bad batch")
    assert "det-launch" not in four["output_tail"]


def test_kill_and_activate_under_pauses_rules(tree: pathlib.Path) -> None:
    root = tree / "det_experiments"
    subprocess.run([sys.executable, "-m", "determined_launch.det", "e", "list"], check=True,
                   env={**os.environ, "DET_EXPERIMENTS_DIR": str(root)}, capture_output=True,
                   timeout=60)  # the root adopts the experiment: it gets an id
    exp = root / NAME
    assert json.loads((exp / "det_experiment.json").read_text())["id"] == 1
    s = Served("--actions", cwd=tree, token=True)
    try:
        bearer = {"Authorization": f"Bearer {s.token}"}
        acts = json.loads(s.get("/api/v1/actions", bearer)[2])
        assert acts["kill"] and acts["activate"] and acts["pause"]
        ok = {**bearer, "X-CSRF-Token": acts["csrf"]}
        kill, activate = (f"/api/v1/experiments/{NAME}/{v}" for v in ("kill", "activate"))
        assert s.post(kill, {"X-CSRF-Token": acts["csrf"]})[0] == 401  # the token, still
        assert s.post(kill, bearer)[0] == 403  # no CSRF header
        assert s.post(kill, {**ok, "Origin": "http://evil.example"})[0] == 403
        assert s.post("/api/v1/experiments/nope/kill", ok)[0] == 404
        # activate restarts what det e create recorded: refused for a tree others may write
        (exp / "context").mkdir()
        (exp / "det_driver.json").write_text(json.dumps({"argv": ["experiment", "x.yaml"]}))
        exp.chmod(0o777)
        status, body = s.post(activate, ok)
        assert status == 409 and "not this user's alone" in body["error"], body
        exp.chmod(0o755)
        assert not (exp / "experiment.log").exists()  # nothing was started
        assert not (exp / "det_killed").exists()
        status, body = s.post(kill, ok)
        assert status == 200 and body["action"] == "kill", body
        assert (exp / "det_killed").exists()  # det's mark: the experiment is canceled
        assert (exp / "trials" / "4" / "preempt").exists()  # its running trial stops now
    finally:
        s.stop()
    # its worker gone, the trial is not "paused, resumable": the experiment is canceled
    _set_attr(exp, 3, "det_owner", "")
    from determined_launch.ui.api import Api

    api = Api([str(root)])
    four = api.trial(NAME, 4) or {}
    assert four["state"] == "canceled" and four["ended"].startswith("canceled")
    assert (api.experiment(NAME) or {})["state"] == "canceled"


def _set_attr(exp: pathlib.Path, number: int, key: str, value: object) -> None:
    import optuna

    from determined_launch.experiment import searchers as se

    study = optuna.load_study(study_name=NAME,
                              storage=se.open_storage(None, str(exp / "study.journal")))
    study._storage.set_trial_user_attr(study.trials[number]._trial_id, key, value)


def test_the_pages_say_not_found_and_show_the_asha_pill(served: Served) -> None:
    """Chromium: an unknown experiment is "not found" with a link home, and the
    page stops asking; a stopped trial's pill has its colour; exec's log filter."""
    from tests._ui_helpers import chromium, playwright_or_skip

    playwright = playwright_or_skip()
    with chromium() as browser:
        page = browser.new_page()
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/nope" in r.url else None)
        began = time.monotonic()
        page.goto(f"{served.url}experiments/nope")
        expect = playwright.expect
        expect(page.locator("h1")).to_have_text("Not found", timeout=10_000)
        took = time.monotonic() - began
        expect(page.get_by_role("link", name="All experiments and runs")).to_be_visible()
        n = len(asked)
        time.sleep(2.5)
        assert len(asked) == n, asked  # it stopped asking once it said "not found"
        # each answer asked for once, and once more per poll tick (1 s) that came before
        # the first 404 landed (a loaded machine answers slowly): never polled on
        assert max(collections.Counter(asked).values()) <= 2 + int(took), (took, asked)
        page.goto(f"{served.url}experiments/{NAME}")
        pill = page.locator("tbody .state.stopped-asha")
        expect(pill).to_have_text("stopped (ASHA)", timeout=10_000)
        # retried: the page may redraw (new nodes) between finding the pill and reading it
        expect(pill).to_have_css("background-color", "rgb(254, 243, 199)")
        page.goto(f"{served.url}experiments/{NAME}/trials/2")
        head = page.locator(".card").first
        expect(head).to_contain_text("stopped by the searcher (ASHA) at length 25")
        assert not re.search(r"exit status 75|resumable \(", head.inner_text())
        page.goto(f"{served.url}experiments/{NAME}/trials/3")
        ranks = page.locator("select.ranks")
        expect(ranks).to_contain_text("not labelled by rank", timeout=10_000)
        expect(ranks).to_be_disabled()
