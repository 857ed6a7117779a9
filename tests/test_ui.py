"""det-launch ui: the pure parts on small trees, then the server over real HTTP."""

from __future__ import annotations

import json
import math
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from determined_launch.core._rundir import RunDir
from determined_launch.ui import files, shape
from determined_launch.ui.api import Api
from determined_launch.ui.server import UiServer
from tests._ui_helpers import NAME, SECRET, Served, make_experiment, make_run
from tests._ui_helpers import _dist as _ui_dist

pytest.importorskip("optuna")

# -- pure parts ------------------------------------------------------------------------


def test_downsampling_keeps_spikes_and_the_newest_point() -> None:
    values = [1.0] * 10_000
    values[4321] = 99.0  # one spike
    values[777] = -5.0
    values[-1] = 2.0
    keep = shape.bucket_extremes(values, 100)
    assert len(keep) <= 102
    assert {4321, 777, 9999} <= set(keep)
    assert keep == sorted(keep)
    short = [1.0, math.nan, 3.0]
    assert shape.bucket_extremes(short, 100) == [0, 2]  # short series: every present point


def test_redact_hides_secret_keys_and_url_passwords() -> None:
    out = shape.redact({"lr": 0.1, "db_password": "pw", "nested": {"api_key": "k", "key": "v",
                        "monkey": 1}, "url": "postgresql://me:pw@db/x", "list": ["s3://a:b@h/p"]})
    assert out["lr"] == 0.1 and out["nested"]["monkey"] == 1
    assert out["db_password"] == out["nested"]["api_key"] == out["nested"]["key"] == "***"
    assert out["url"] == "postgresql://***@db/x" and out["list"] == ["s3://***@h/p"]
    assert shape.redact_text("run (token=abc) DB_PASSWORD: pw ok") == \
        "run (token=***) DB_PASSWORD: *** ok"


def test_streams_read_only_what_was_appended(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "training.jsonl"
    run = RunDir(tmp_path, trial_id=None)
    run.append("training", {"steps_completed": 1, "metrics": {"loss": 1.0, "note": "a"}})
    streams = files.Streams()
    roots = [str(tmp_path)]
    assert len(streams.get(str(path), roots)) == 1
    with open(path, "a") as f:
        f.write('{"steps_completed": 2, "metrics": {"loss": 0.5}}\n{"steps_com')  # torn line
    table = streams.get(str(path), roots)
    assert [r["steps_completed"] for r in table.rows()] == [1, 2]
    assert table.row(0)["metrics"] == {"loss": 1.0, "note": "a"}
    with open(path, "a") as f:
        f.write('pleted": 3, "metrics": {"loss": 0.25, "acc": 1}}\n')
    table = streams.get(str(path), roots)
    assert [r["metrics"] for r in table.rows()][2] == {"loss": 0.25, "acc": 1}
    entry = streams._entries.get(str(path))
    assert entry is not None
    assert entry.offset == path.stat().st_size
    path.write_text('{"steps_completed": 9, "metrics": {"x": 1}}\n')  # replaced: read again
    assert [r["steps_completed"] for r in streams.get(str(path), roots).rows()] == [9]


def test_chart_rows_are_downsampled_and_the_raw_rows_complete(tmp_path: pathlib.Path) -> None:
    with open(tmp_path / "training.jsonl", "w") as f:
        for i in range(5000):
            loss = 50.0 if i == 3210 else 1.0 / (i + 1)
            f.write(json.dumps({"steps_completed": i + 1, "metrics": {"loss": loss}}) + "\n")
    from determined_launch.ui.runs import RunReader

    reader = RunReader([str(tmp_path)])
    chart = reader.metrics(str(tmp_path), "training", max_points=100)
    assert len(chart) <= 102
    steps = [r["steps_completed"] for r in chart]
    assert steps == sorted(steps) and 3211 in steps and steps[-1] == 5000
    assert reader.metrics(str(tmp_path), "training", max_points=100) is chart  # cached
    assert len(reader.metrics(str(tmp_path), "training")) == 5000
    assert [r["steps_completed"] for r in reader.metrics(str(tmp_path), "training",
                                                         since=4998)] == [4999, 5000]


def test_a_long_stream_answers_a_chart_with_a_preview_while_it_is_read(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A downsampled request for a stream not read yet gets evenly spaced rows
    (and the newest) at once, then the shape-keeping rows once the background
    read ends; a request for every row never gets a preview."""
    from determined_launch.ui import files, runs

    rows = [{"steps_completed": i + 1, "time": 1e9 + i,
             "metrics": {"loss": 50.0 if i == 3210 else 1.0 / (i + 1)}} for i in range(5000)]
    with open(tmp_path / "training.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.write('{"steps_completed": 5001, "metr')  # being written: not a row yet
    monkeypatch.setattr(runs, "PREVIEW_BYTES", 1000)
    reader = runs.RunReader([str(tmp_path)])
    preview, sampled = reader.chart(str(tmp_path), "training", max_points=128)  # a chart size
    assert sampled
    steps = [r["steps_completed"] for r in preview]
    assert 115 <= len(steps) <= 129 and steps == sorted(set(steps))
    assert steps[0] == 1 and steps[-1] == 5000  # from the first row to the newest
    assert all(r["metrics"] == rows[r["steps_completed"] - 1]["metrics"] for r in preview)
    assert reader.last_step(str(tmp_path)) == 5000  # list pages read the newest line only
    assert reader.activity(str(tmp_path)) == (1e9, 1e9 + 4999)  # start, last update
    deadline = time.monotonic() + 30
    while sampled and time.monotonic() < deadline:
        time.sleep(0.05)
        chart, sampled = reader.chart(str(tmp_path), "training", max_points=100)
    assert not sampled and 3211 in [r["steps_completed"] for r in chart]  # the spike kept
    # a stream with fewer lines than asked for: each whole line once
    few = files.sample(str(tmp_path / "training.jsonl"), [str(tmp_path)], 10_000)
    assert [r["steps_completed"] for r in few.rows()] == list(range(1, 5001))


def test_confinement_refuses_symlinks_out_of_the_tree(tmp_path: pathlib.Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("private\n")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link.txt").symlink_to(outside)
    (root / "ok.txt").write_text("fine\n")
    assert files.read_text(str(root / "ok.txt"), [str(root)]) == "fine\n"
    assert files.read_text(str(root / "link.txt"), [str(root)]) is None
    assert files.read_text(str(root / ".." / "outside.txt"), [str(root)]) is None
    # A stream read once, then swapped for a symlink out of the tree, is refused.
    streams = files.Streams()
    stream = root / "training.jsonl"
    stream.write_text('{"steps_completed": 1, "metrics": {"loss": 1}}\n')
    assert len(streams.get(str(stream), [str(root)])) == 1
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"steps_completed": 7, "metrics": {"pin": 1234}}\n')
    stream.unlink()
    stream.symlink_to(secret)
    assert len(streams.get(str(stream), [str(root)])) == 0


def test_api_answers_from_study_and_files(tmp_path: pathlib.Path) -> None:
    exps = tmp_path / "det_experiments"
    make_experiment(exps)
    make_run(tmp_path / "det_runs")
    api = Api([str(exps), str(tmp_path / "det_runs")])
    [summary] = api.experiments()
    assert summary["name"] == NAME and summary["searcher"] == "adaptive_asha"
    assert summary["state"] == "running" and summary["num_trials"] == 4
    assert summary["best_trial"] == {"trial_id": 1, "value": 0.5}
    assert summary["trial_states"] == {"completed": 1, "stopped (ASHA)": 1,
                                       "invalid hparams": 1, "running": 1}
    trials = {t["trial_id"]: t for t in api.trials(NAME) or []}
    deadline = time.monotonic() + 5  # finished trials' file columns come from a thread
    while trials[1]["checkpoints"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
        trials = {t["trial_id"]: t for t in api.trials(NAME) or []}
    assert trials[4]["checkpoints"] == 0  # running: read at once
    assert trials[1]["hparams"] == {"lr": 0.01, "width": 32}
    assert trials[1]["length"] == 100 and trials[1]["checkpoints"] == 1
    assert trials[1]["restarts"] == 2 and trials[2]["restarts"] == 0  # the study's count
    assert trials[2]["state"] == "stopped (ASHA)" and trials[3]["state"] == "invalid hparams"
    run_dir = api.trial_dir(NAME, 1)
    assert run_dir is not None
    steps = [r["steps_completed"] for r in api.runs_reader.metrics(run_dir, "training")]
    assert steps == list(range(10, 101, 10))
    [ck] = api.runs_reader.checkpoints(run_dir, api.experiment_storage(NAME))
    assert ck["state"] == "COMPLETED" and ck["steps_completed"] == 100 and ck["size"] > 1000
    text, _ = api.runs_reader.output.logs(run_dir, 1, None)
    assert text == "[rank=1] rank one line\n"
    assert api.trial(NAME, 99) is None and api.trials("nope") is None
    [run] = api.run_pages.runs()
    assert run["name"] == "local" and run["steps_completed"] == 3


def test_a_trials_exit_status_is_the_launchers_last_summary_line(tmp_path: pathlib.Path) -> None:
    exps = tmp_path / "det_experiments"
    exp = make_experiment(exps)
    with open(exp / "trials" / "1" / "output.log", "a") as f:  # resumed, then completed
        f.write("[rank=0] resumed\ndet-launch: job succeeded on 1 node (exit status 0)\n")
    api = Api([str(exps)])
    one, two, four = (api.trial(NAME, i) or {} for i in (1, 2, 4))
    assert one["exit_status"] == 0 and one["outcome"] == "job succeeded on 1 node (exit status 0)"
    # ASHA's stop is the driver's preemption, no exit status 75 (issue 36 §1: test_ui_states.py)
    assert two["exit_status"] is None and two["outcome"] == (
        "stopped by the searcher (ASHA) at length 25")
    assert two["launcher_events"][-1].startswith("det-launch: job preempted")  # the raw lines
    assert four["state"] == "running" and four["exit_status"] is None  # an earlier attempt's
    assert api.runs_reader.output.outcome(["det-launch: job failed: rank 1 exited with status 2 "
                                    "first; exit status 2"])["exit_status"] == 2


def test_importance_names_the_hyperparameter_that_matters(tmp_path: pathlib.Path) -> None:
    import optuna

    from determined_launch.experiment import searchers as se

    make_experiment(tmp_path)
    api = Api([str(tmp_path)])
    assert api.importance(NAME) == {"importance": {}, "method": "PED-ANOVA (Optuna)"}
    storage = se.open_storage(None, str(tmp_path / NAME / "study.journal"))
    study = optuna.load_study(study_name=NAME, storage=storage)
    for i in range(40):  # the loss follows lr; width is noise
        lr, width = 10 ** (-4 + 4 * i / 40), [32, 64][i % 2]
        study.add_trial(optuna.trial.create_trial(
            params={"lr": lr, "width": width}, distributions=_ui_dist(), value=lr))
    time.sleep(0.6)
    found = (api.importance(NAME) or {})["importance"]
    assert set(found) == {"lr", "width"} and found["lr"] > found["width"]


def test_a_path_may_be_one_experiment_or_one_run(tmp_path: pathlib.Path) -> None:
    exp = make_experiment(tmp_path / "a")
    run = make_run(tmp_path / "b", "my-run")
    api = Api([str(exp), str(run)])
    assert [e["name"] for e in api.experiments()] == [NAME]
    assert [r["name"] for r in api.run_pages.runs()] == ["my-run"]


def test_a_dead_workers_trial_is_paused_and_a_password_study_needs_its_url(
        tmp_path: pathlib.Path) -> None:
    import optuna

    from determined_launch.experiment import searchers as se

    exp = make_experiment(tmp_path)
    study = optuna.load_study(study_name=NAME,
                              storage=se.open_storage(None, str(exp / "study.journal")))
    running = [t for t in study.get_trials() if t.state.name == "RUNNING"][0]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    study._storage.set_trial_user_attr(running._trial_id, "det_owner",
                                       f"{socket.gethostname()}:{dead}:0")
    api = Api([str(tmp_path)])
    assert {t["trial_id"]: t["state"] for t in api.trials(NAME) or []}[4] == "paused"

    record = json.loads((exp / "experiment.json").read_text())
    record.update(storage="postgresql://me:***@db/x", storage_has_password=True)
    (tmp_path / "pg").mkdir()
    (tmp_path / "pg" / "experiment.json").write_text(json.dumps({**record, "name": "pg"}))
    [pg] = [e for e in Api([str(tmp_path / "pg")]).experiments()]
    assert pg["state"] == "unknown" and "--study-storage" in pg["error"]
    assert "***" in pg["storage"] and "me:" not in json.dumps(pg).replace("me:***", "")


def test_new_experiments_appear_without_a_restart(tmp_path: pathlib.Path) -> None:
    api = Api([str(tmp_path)])
    assert api.experiments() == []
    make_experiment(tmp_path, "later")
    time.sleep(0.6)  # the catalog's scan is reused for TTL seconds
    assert [e["name"] for e in api.experiments()] == ["later"]


# -- the server over HTTP ----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    make_experiment(tmp_path / "det_experiments")
    make_run(tmp_path / "det_runs")
    return tmp_path


@pytest.fixture
def served(tree: pathlib.Path) -> Iterator[Served]:
    s = Served(cwd=tree)  # the default PATHs: ./det_experiments and ./det_runs
    yield s
    s.stop()


def test_api_over_http(served: Served) -> None:
    assert served.first_line == f"det-launch ui: serving {served.url}"
    [exp] = served.json("/api/v1/experiments")
    assert {"name", "searcher", "state", "num_trials", "best_trial"} <= set(exp)
    trials = served.json(f"/api/v1/experiments/{NAME}/trials")
    assert [t["trial_id"] for t in trials] == [1, 2, 3, 4]
    assert {"trial_id", "state", "hparams", "best_value", "length"} <= set(trials[0])
    val = served.json(f"/api/v1/experiments/{NAME}/trials/1/metrics?group=validation")
    assert val == [{"steps_completed": 50, "time": val[0]["time"], "metrics": {"loss": 0.9}},
                   {"steps_completed": 100, "time": val[1]["time"], "metrics": {"loss": 0.5}}]
    [ck] = served.json(f"/api/v1/experiments/{NAME}/trials/1/checkpoints")
    assert {"uuid", "steps_completed", "state"} <= set(ck)
    status, headers, body = served.get(f"/api/v1/experiments/{NAME}/trials/1/logs")
    assert status == 200 and b"[rank=0] trial 1 says hello" in body
    assert headers["Content-Type"].startswith("text/plain")
    assert served.json("/api/v1/runs/local/metrics?group=training")[2]["metrics"] == {"loss": 1.0}
    for page in ("/", f"/experiments/{NAME}", f"/experiments/{NAME}/trials/2", "/runs/local",
                 "/compare", "/static/core.js"):
        assert served.get(page)[0] == 200, page


def test_not_found_and_traversal(served: Served, tree: pathlib.Path) -> None:
    outside = tree / "outside"
    outside.mkdir()
    RunDir(outside / "victim", trial_id=None).append("training", {"steps_completed": 1,
                                                                 "metrics": {"pin": 1234}})
    (tree / "det_runs" / "escape").symlink_to(outside / "victim")  # a run dir out of the tree
    (tree / "det_runs" / "local" / "validation.jsonl").symlink_to(
        outside / "victim" / "training.jsonl")  # a file out of the tree
    time.sleep(0.6)
    for path in ("/api/v1/experiments/nope", f"/api/v1/experiments/{NAME}/trials/99/metrics",
                 "/api/v1/runs/%2e%2e/metrics", "/api/v1/runs/..%2F..%2Foutside/metrics",
                 "/api/v1/runs/escape/metrics?group=training", "//etc/passwd",
                 "/api/v1/runs//etc/passwd", "/static/../api.py", "/static/%2e%2e%2fapi.py",
                 "/api/v1/runs/local/metrics?group=..%2F..%2Foutside%2Fvictim%2Ftraining",
                 "/api/v1/experiments/%2Fetc/trials"):
        status, _, body = served.get(path)
        assert status == 404, (path, status, body)
    assert served.json("/api/v1/runs/local/metrics?group=validation") == []
    assert [r["name"] for r in served.json("/api/v1/runs")] == ["local"]
    req = urllib.request.Request(served.url + "api/v1/experiments", method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)  # noqa: S310
    assert e.value.code == 405


def test_secrets_never_reach_a_page(served: Served) -> None:
    bodies = [served.get(p)[2] for p in (
        "/api/v1/experiments", f"/api/v1/experiments/{NAME}/trials",
        f"/api/v1/experiments/{NAME}/trials/1", f"/api/v1/experiments/{NAME}/trials/1/checkpoints",
        "/api/v1/runs", "/api/v1/runs/local")]
    assert all(SECRET.encode() not in b for b in bodies)
    detail = served.json(f"/api/v1/experiments/{NAME}/trials/1")
    assert detail["hparams_all"]["db_password"] == "***" and detail["hparams_all"]["lr"] == 0.01


def test_live_update_within_two_seconds(served: Served, tree: pathlib.Path) -> None:
    url = "/api/v1/runs/local/metrics?group=training"
    status, headers, _ = served.get(url)
    assert served.get(url, {"If-None-Match": headers["ETag"]})[0] == 304
    RunDir(tree / "det_runs" / "local", trial_id=None).append(
        "training", {"steps_completed": 4, "metrics": {"loss": 0.125}})
    RunDir(tree / "det_runs" / "newer", trial_id=None).append(
        "validation", {"steps_completed": 1, "metrics": {"acc": 0.5}})
    status, headers, _ = served.get("/api/v1/runs/local/logs")
    offset = int(headers["X-Log-Offset"])
    with open(tree / "det_runs" / "local" / "output.log", "a") as f:
        f.write("[rank=0] a new line\n[rank=1] other\n")
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        rows = served.json(url)
        names = [r["name"] for r in served.json("/api/v1/runs")]
        if rows[-1]["metrics"] == {"loss": 0.125} and "newer" in names:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"not seen within 2 s: {rows[-1]}, {names}")
    _, _, body = served.get(f"/api/v1/runs/local/logs?offset={offset}&rank=0")
    assert body == b"[rank=0] a new line\n"


def test_token_cookie_and_bearer(tree: pathlib.Path) -> None:
    api = Api([str(tree / "det_experiments")])
    server = UiServer(("127.0.0.1", 0), api, token="t0ken")  # as off loopback
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/api/v1/experiments"

    def get(url: str, headers: dict[str, str]) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),  # noqa: S310
                                        timeout=10) as r:
                return r.status, r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.headers

    try:
        assert get(base, {})[0] == 401
        assert get(base + "?token=wrong", {})[0] == 403
        assert get(base, {"Authorization": "Bearer wrong"})[0] == 403
        assert get(base, {"Authorization": "Bearer t0ken"})[0] == 200
        status, headers = get(base + "?token=t0ken", {})
        cookie = headers["Set-Cookie"]
        assert status == 200 and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert get(base, {"Cookie": cookie.split(";")[0]})[0] == 200
        assert get(base, {"Cookie": "det_ui_token=nope"})[0] == 403
    finally:
        server.shutdown()
        server.server_close()


def test_pause_needs_actions_the_token_and_the_csrf_header(tree: pathlib.Path) -> None:
    """``--actions`` offers one write: pausing a running experiment touches its
    running trials' preempt files (what the driver watches), nothing else. It
    needs the token (required on loopback too then), the CSRF header only the
    API gives, and a same-origin Origin; without ``--actions`` POST is 405."""
    trial4 = tree / "det_experiments" / NAME / "trials" / "4" / "preempt"
    pause = f"/api/v1/experiments/{NAME}/pause"
    plain = Served(cwd=tree)
    try:
        assert plain.post(pause)[0] == 405
        assert plain.json("/api/v1/actions") == {"pause": False, "kill": False,
                                                 "activate": False, "csrf": None}
    finally:
        plain.stop()
    s = Served("--actions", cwd=tree, token=True)
    try:
        assert s.get("/api/v1/actions")[0] == 401  # no token: even on loopback
        bearer = {"Authorization": f"Bearer {s.token}"}
        csrf = json.loads(s.get("/api/v1/actions", bearer)[2])["csrf"]
        assert csrf and csrf != s.token
        assert s.post(pause, {"X-CSRF-Token": csrf})[0] == 401  # the token, still
        assert s.post(pause, bearer)[0] == 403  # no CSRF header: a form elsewhere
        assert s.post(pause, {**bearer, "X-CSRF-Token": "x" * len(csrf)})[0] == 403
        assert s.post(pause, {**bearer, "X-CSRF-Token": csrf,
                              "Origin": "http://evil.example"})[0] == 403
        assert not trial4.exists()
        ok = {**bearer, "X-CSRF-Token": csrf, "Origin": s.url.rstrip("/")}
        status, body = s.post(pause, ok)
        assert status == 200 and body == {"experiment": NAME, "preempted_trials": [4]}
        assert trial4.exists()  # the running trial only
        assert not any((tree / "det_experiments" / NAME / "trials" / str(i) / "preempt").exists()
                       for i in (1, 2, 3))
        assert s.post("/api/v1/experiments/nope/pause", ok)[0] == 404
        assert s.post(f"/api/v1/experiments/{NAME}/trials/4", ok)[0] == 404
    finally:
        s.stop()


def test_loopback_refuses_a_foreign_host_header(served: Served) -> None:
    assert served.get("/api/v1/experiments", {"Host": "evil.example:80"})[0] == 403


def test_bad_input_is_one_line_and_status_2(tmp_path: pathlib.Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from determined_launch.cli import main

    for args, needle in (([str(tmp_path / "missing")], "no such directory"),
                         (["--port", "http"], "--port"),
                         (["--bogus"], "unrecognized")):  # s3:// PATHs: test_ui_storage.py
        assert main(["ui", *args]) == 2, args
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and needle in err and not out, err


def test_importing_the_package_imports_no_ui() -> None:
    code = ("import sys, determined_launch, determined_launch.cli; "
            "bad = [m for m in sys.modules "
            "if m.startswith('determined_launch.ui') or m == 'torch'];"
            "print(json.dumps(bad))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert json.loads(out) == []


def test_the_journal_reader_sees_what_optuna_sees(tmp_path: pathlib.Path) -> None:
    """ui/journal.py reads a real journal (ask/tell, add_trial, a second study,
    pruned, failed, running, int and categorical params, a torn last line) as
    Optuna's own replay does."""
    import optuna

    from determined_launch.experiment import searchers as se
    from determined_launch.ui.journal import JournalReader

    path = tmp_path / "study.journal"
    storage = se.open_storage(None, str(path))
    other = optuna.create_study(study_name="other", storage=storage)
    study = optuna.create_study(study_name="s", storage=storage, direction="minimize")
    other.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    for i, end in enumerate(["complete", "pruned", "fail", "running", "complete"]):
        t = study.ask()
        t.suggest_float("lr", 1e-4, 1.0, log=True)
        t.suggest_int("layers", 1, 8)
        t.suggest_categorical("act", ["relu", "tanh", None])
        t.set_user_attr("det_hparams", {"lr": i})
        for step in (10, 20):
            t.report(1.0 / (step + i), step)
        if end == "complete":
            study.tell(t, 0.5 + i)
        elif end == "pruned":
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        elif end == "fail":
            t.set_user_attr("det_error", "exit status 1")
            study.tell(t, state=optuna.trial.TrialState.FAIL)
    study.add_trial(optuna.trial.create_trial(
        params={"lr": 0.1}, distributions={"lr": _ui_dist()["lr"]}, value=0.25,
        intermediate_values={5: 0.3}, user_attrs={"k": [1, 2]}))
    with open(path, "ab") as f:
        f.write(b'{"op_code": 8, "trial_id": 0')  # a writer killed mid-line

    def view(t: Any) -> tuple[Any, ...]:
        return (t.number, t.state.name, t.params, t.user_attrs, t.intermediate_values,
                t.value, t.datetime_start, t.datetime_complete)

    theirs = optuna.load_study(study_name="s", storage=se.open_storage(None, str(path)))
    reader = JournalReader(str(path), "s")
    ours = reader.trials() or []
    assert [view(t) for t in ours] == [view(t) for t in theirs.get_trials(deepcopy=False)]
    assert [t.state.name for t in ours] == ["COMPLETE", "PRUNED", "FAIL", "RUNNING",
                                            "COMPLETE", "COMPLETE"]
    # appended operations are read on the next call, from where the last one ended
    with open(path, "rb+") as f:
        data = f.read()
        f.seek(0)
        f.truncate()
        f.write(data[:data.rfind(b"\n") + 1])
    optuna.load_study(study_name="s", storage=se.open_storage(None, str(path))).tell(3, 0.125)
    again = optuna.load_study(study_name="s", storage=se.open_storage(None, str(path)))
    assert [view(t) for t in reader.trials() or []] == [view(t) for t in again.get_trials()]
    assert JournalReader(str(path), "missing").trials() is None


def test_the_journal_reader_keeps_a_record_spliced_after_a_torn_fragment(
        tmp_path: pathlib.Path) -> None:
    """An older writer appended a whole record right after a torn fragment:
    the study's own backend (experiment/journal.py) keeps the record after
    the fragment, and the UI's reader replays the same trials instead of
    refusing the journal; a line that is no record at all stops both."""
    import optuna

    from determined_launch.errors import LaunchError
    from determined_launch.experiment import searchers as se
    from determined_launch.ui.journal import JournalReader

    path = tmp_path / "study.journal"
    study = optuna.create_study(study_name="s", storage=se.open_storage(None, str(path)))
    for i in range(3):
        t = study.ask()
        t.suggest_float("lr", 1e-4, 1.0, log=True)
        t.set_user_attr("det_hparams", {"lr": i})
        study.tell(t, 0.5 + i)
    lines = path.read_bytes().splitlines(keepends=True)
    at = next(i for i, x in enumerate(lines) if b'"op_code":8' in x.replace(b" ", b""))
    lines[at] = b'{"op_code": 8, "trial_id": 0, "user_at' + lines[at]
    path.write_bytes(b"".join(lines))

    def view(t: Any) -> tuple[Any, ...]:
        return t.number, t.state.name, t.params, t.user_attrs, t.value

    theirs = optuna.load_study(study_name="s", storage=se.open_storage(None, str(path)))
    ours = JournalReader(str(path), "s").trials() or []
    assert [view(t) for t in ours] == [view(t) for t in theirs.get_trials(deepcopy=False)]
    assert ours[0].user_attrs == {"det_hparams": {"lr": 0}}  # the spliced record counted

    lines[at] = b"not a record\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(ValueError, match="not a journal record"):
        JournalReader(str(path), "s").trials()
    with pytest.raises(LaunchError, match=f"line {at + 1} is not a journal record"):
        optuna.load_study(study_name="s", storage=se.open_storage(None, str(path)))


def test_finite_reaches_into_tuples() -> None:  # a curve's points are (length, value) pairs
    assert shape.finite([(1, float("nan")), (2, 0.5)]) == [[1, None], [2, 0.5]]
    assert shape.finite({"a": {"b": float("inf")}, "c": "x"}) == {"a": {"b": None}, "c": "x"}


def test_a_checkpoint_being_written_is_measured_again(tmp_path: pathlib.Path) -> None:
    from determined_launch.ui.runs import RunReader

    run = RunDir(tmp_path / "runs" / "r", trial_id=None).path
    uuid = "11111111-2222-4333-8444-555555555555"
    ck = tmp_path / "runs" / "checkpoints" / uuid
    ck.mkdir(parents=True)
    (ck / "metadata.json").write_text("{}")
    run.mkdir(parents=True, exist_ok=True)
    (run / "latest_checkpoint.json").write_text(json.dumps({"pending": uuid}))
    reader = RunReader([str(tmp_path)])
    storage = [str(ck.parent)]
    [first] = reader.checkpoints(str(run), storage)
    (ck / "weights.bin").write_bytes(bytes(5000))
    [then] = reader.checkpoints(str(run), storage)
    assert first["state"] == then["state"] == "UNCOMMITTED"
    assert then["size"] == first["size"] + 5000


def test_a_long_columns_first_read_keeps_the_rows_the_row_loop_keeps() -> None:
    import random
    from array import array

    rng = random.Random(1)
    for n, ties in ((70_000, False), (100_001, True), (65_536, False)):
        values = array("d", [rng.choice([0.5, 1.0]) if ties else rng.random() for _ in range(n)])
        for i in range(0, n, 7919):
            values[i] = [math.nan, math.inf, -math.inf][i % 3]
        values[500:900] = array("d", [math.nan]) * 400  # rows without the metric
        bulk = shape.Extremes(1000)
        bulk.update(values)  # one long first read
        rows = shape.Extremes(1000)
        rows.update(values[:1])
        rows.update(values)  # grown row by row
        assert (bulk.size, bulk.lo, bulk.hi) == (rows.size, rows.lo, rows.hi)
        values.extend([rng.random() for _ in range(5000)])
        bulk.update(values)
        rows.update(values)
        assert bulk.indices(values) == rows.indices(values)
