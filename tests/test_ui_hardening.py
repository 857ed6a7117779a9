"""Issue 34 §1-7, §11: the WebUI and the bucket mirror against a hostile visitor
or a hostile file. Pure parts first, then real servers on loopback."""

from __future__ import annotations

import json
import os
import pathlib
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from determined_launch.common.redact import printable, redact, redact_text
from determined_launch.core._rundir import RunDir
from determined_launch.ui import files
from determined_launch.ui.api import Api
from determined_launch.ui.runs import RunReader
from tests._ui_helpers import make_experiment, make_run

pytest.importorskip("optuna")


# -- §6 redaction, §7 escapes (pure) ------------------------------------------------------


@pytest.mark.parametrize("text, secret", [
    ('{"password": "hunter2", "lr": 0.1}', "hunter2"),
    ("{'secret': 'hunter2', 'lr': 0.1}", "hunter2"),
    ("Authorization: Bearer hunter2hunter2", "hunter2hunter2"),
    ("curl -H 'authorization: bearer hunter2hunter2'", "hunter2hunter2"),
    ("python train.py --password hunter2 --lr 3", "hunter2"),
    ("api_key=hunter2", "hunter2"),
    ("db: postgresql://me:hunter2@db:5432/x", "hunter2"),
    ("db: postgresql://me:p@ss@db/x", "ss@db"),
    ('{"aws_secret_access_key":"hunter2"}', "hunter2"),
])
def test_one_redaction_rule_masks_every_form(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out and "***" in out, out
    assert redact_text("step 5 loss=0.3 lr: 0.1 --epochs 3") == "step 5 loss=0.3 lr: 0.1 --epochs 3"


def test_redaction_is_linear_on_a_long_line() -> None:
    started = time.process_time()
    for text in ("a-" * 300_000, "password" * 80_000, "x://" + "a@" * 300_000):
        redact_text(text)
    assert time.process_time() - started < 10  # quadratic: minutes


def test_the_experiment_console_masks_secret_hparams() -> None:
    from determined_launch.experiment import report

    class Trial:
        number = 0
        state = type("S", (), {"name": "COMPLETE"})()
        intermediate_values = {10: 0.5}
        values = [0.5]
        value = 0.5
        user_attrs = {"det_hparams": {"api_key": "hunter2", "db": "postgresql://u:hunter2@h/x",
                                      "lr": 0.1}}
        params: dict[str, Any] = {}
        datetime_start = datetime_complete = None

    table = report.render_table([Trial()], "loss", True)
    assert "hunter2" not in table and "lr=0.1" in table, table
    assert redact({"nested": {"password": "x"}}) == {"nested": {"password": "***"}}


def test_printable_makes_escapes_inert() -> None:
    assert printable("a\x1b]0;pwn\x07b\nc\x9b") == "a\\x1b]0;pwn\\x07b\\nc\\x9b"


# -- §4 malformed files, §5 long lines (the readers) ---------------------------------------


def test_a_bad_line_costs_itself_only(tmp_path: pathlib.Path) -> None:
    good = [json.dumps({"steps_completed": i, "metrics": {"loss": 1.0 / (i + 1)}})
            for i in range(300)]
    bad = ["[" * 200_000 + "]" * 200_000,  # RecursionError, not ValueError
           json.dumps({"steps_completed": 1, "metrics": {"big": 10 ** 400}}),  # OverflowError
           '{"steps_completed": 2, "metrics": {"s": "' + "x" * 5000 + '"}}']
    lines = good[:100] + bad[:1] + good[100:200] + bad[1:] + good[200:]
    (tmp_path / "training.jsonl").write_text("\n".join(lines) + "\n")
    table = files.Streams().get(str(tmp_path / "training.jsonl"), [str(tmp_path)])
    losses = [r["metrics"].get("loss") for r in table.rows()]
    assert [x for x in losses if x is not None] == [1.0 / (i + 1) for i in range(300)]
    kept = [r["metrics"] for r in table.rows() if "big" in r["metrics"] or "s" in r["metrics"]]
    assert kept[0]["big"] == str(10 ** 400)[:1024] and len(kept[1]["s"]) <= 1030


def test_one_malformed_experiment_leaves_the_others_on_the_home_page(
        tmp_path: pathlib.Path) -> None:
    root = tmp_path / "exps"
    make_experiment(root, "good")
    bad_max = make_experiment(root, "bad-max")
    record = json.loads((bad_max / "experiment.json").read_text())
    record["searcher"]["max_trials"] = "abc"
    (bad_max / "experiment.json").write_text(json.dumps(record))
    deep = make_experiment(root, "deep")
    with open(deep / "study.journal", "a") as f:
        f.write("[" * 200_000 + "]" * 200_000 + "\n")
    step = make_experiment(root, "bad-step")
    with open(step / "study.journal", "a") as f:
        f.write(json.dumps({"op_code": 7, "worker_id": "w", "trial_id": 3, "step": "abc",
                            "intermediate_value": 1.0}) + "\n")
    api = Api([str(root)])
    shown = {e["name"]: e for e in api.experiments()}
    assert sorted(shown) == ["bad-max", "bad-step", "deep", "good"]
    assert shown["good"]["num_trials"] == 4 and not shown["good"]["error"]
    assert shown["bad-max"]["state"] == "unreadable" and "max_trials" in shown["bad-max"]["error"]
    for name in ("deep", "bad-step"):
        assert shown[name]["error"] and shown[name]["state"] in ("unknown", "unreadable"), name
        assert api.trial(name, 1) is not None  # the trial page: the error, not a 500
        assert api.trials_body(name) is not None


def test_following_goes_on_after_long_lines(tmp_path: pathlib.Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # a log line over the read limit, then a tqdm bar (\r, no \n), then a normal line
    log = tmp_path / "output.log"
    log.write_bytes(b"[rank=0] start\n" + b"[rank=0] " + b"x" * 3000 + b"\n"
                    + b"[rank=0] 10%\r[rank=0] 20%\r")
    offset, seen = 0, b""
    for _ in range(10):
        data, offset = files.tail_bytes(str(log), [str(tmp_path)], offset, 1024)
        seen += data
    assert offset == log.stat().st_size and b"20%\r" in seen and files.LONG_LINE in seen
    tail, _ = files.tail_bytes(str(log), [str(tmp_path)], None, 1024)
    assert tail  # the newest bytes are shown, not nothing
    # a metrics line over a chunk: skipped and counted, the chart goes on after it
    monkeypatch.setattr(files, "CHUNK", 4096)
    stream = tmp_path / "training.jsonl"
    long = json.dumps({"steps_completed": 2, "metrics": {"s": "y" * 10_000}})
    stream.write_text("\n".join([json.dumps({"steps_completed": 1, "metrics": {"x": 1}}), long,
                                 json.dumps({"steps_completed": 3, "metrics": {"x": 3}})]) + "\n")
    streams = files.Streams()
    table = streams.get(str(stream), [str(tmp_path)])
    assert [r["steps_completed"] for r in table.rows()] == [1, 3] and table.skipped == 1
    with open(stream, "a") as f:
        f.write(json.dumps({"steps_completed": 4, "metrics": {"x": 4}}) + "\n")
    assert [r["steps_completed"] for r in streams.get(str(stream), [str(tmp_path)]).rows()] \
        == [1, 3, 4]


def test_the_outcome_is_read_from_the_end_of_a_long_log_once(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "output.log"
    RunDir(tmp_path, trial_id=None).append("training", {"steps_completed": 1,
                                                        "metrics": {"x": 1}})
    filler = b"[rank=0] " + b"z" * 1000 + b"\n"
    with open(log, "wb") as f:
        f.write(b"det-launch: job failed on 1 node (exit status 3)\n")
        for _ in range(70 * 1024):  # 70 MiB
            f.write(filler)
        f.write(b"det-launch: job succeeded on 1 node (exit status 0)\n")
    reader = RunReader([str(tmp_path)])
    assert reader.output.outcome(reader.output.launcher_events(str(tmp_path)))["exit_status"] == 0
    with open(log, "ab") as f:
        f.write(b"det-launch: job failed on 1 node (exit status 4)\n")
    started = time.process_time()
    assert reader.output.outcome(reader.output.launcher_events(str(tmp_path)))["exit_status"] == 4
    assert time.process_time() - started < 0.05  # the appended line, not 70 MiB again


# -- §3 study storage named by a file ------------------------------------------------------


def test_study_storage_from_experiment_json_stays_in_the_served_tree(
        tmp_path: pathlib.Path) -> None:
    outside = make_experiment(tmp_path / "elsewhere", "other")
    served = tmp_path / "served"
    victim_db = tmp_path / "victim" / "made.db"
    victim_db.parent.mkdir()
    stored = {"other-journal": str(outside / "study.journal"), "passwd": "/etc/passwd",
              "missing": str(tmp_path / "nothing-here"), "sqlite": f"sqlite:///{victim_db}",
              "pg": "postgresql://db.example/x"}
    for name, storage in stored.items():
        exp = make_experiment(served, name)
        record = json.loads((exp / "experiment.json").read_text())
        (exp / "experiment.json").write_text(json.dumps({**record, "storage": storage,
                                                         "name": "other"}))
    api = Api([str(served)])
    shown = api.experiments()
    assert len(shown) == len(stored)
    for e in shown:
        assert e["num_trials"] == 0 and e["error"], e  # never the other experiment's trials
    errors = {e["error"].rsplit(": ", 1)[-1] for e in shown
              if "--study-storage" not in e["error"]}
    assert len(errors) == 1, errors  # the same words whether the file exists or not
    assert not victim_db.exists()  # the read-only UI created nothing
    # inside the tree, a journal named by path is read
    inside = make_experiment(served / "sub", "inside")
    record = json.loads((inside / "experiment.json").read_text())
    (inside / "study.journal").rename(served / "sub" / "moved.journal")
    (inside / "experiment.json").write_text(json.dumps(
        {**record, "storage": str(served / "sub" / "moved.journal")}))
    assert Api([str(served)]).experiment("inside")["num_trials"] == 4


# -- §1 memory, §2 connections, §7 request paths: real servers ------------------------------


def _rss_kib(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def write_stream(path: pathlib.Path, rows: int) -> None:
    line = '{"steps_completed": %d, "time": 1732770000.25, "metrics": {"loss": 0.%06d}}\n'
    with open(path, "w") as f:
        for start in range(0, rows, 10_000):
            f.write("".join(line % (i, i) for i in range(start, min(rows, start + 10_000))))


@pytest.mark.slow
def test_memory_is_bounded_whatever_since_and_max_points(tmp_path: pathlib.Path) -> None:
    """The issue's sequence (every row from since=0..5, then many max_points)
    against a 10 MB stream: the server grows by what the stream is, not by
    what is asked (before: each answer kept as rows and JSON, >500 MB)."""
    from tests._ui_helpers import Served

    run = tmp_path / "runs" / "big"
    run.mkdir(parents=True)
    write_stream(run / "training.jsonl", 150_000)
    served = Served(str(tmp_path / "runs"))
    try:
        pid = served.proc.pid
        status, headers, _ = served.get("/api/v1/runs/big/metrics?group=training")
        assert status == 200
        base = _rss_kib(pid, "VmRSS")
        for since in range(6):
            assert served.get(f"/api/v1/runs/big/metrics?since={since}")[0] == 200
        for points in range(2, 100_000, 997):
            assert served.get(f"/api/v1/runs/big/metrics?max_points={points}")[0] == 200
        grown = (_rss_kib(pid, "VmHWM") - base) / 1024
        print(f"RSS grew {grown:.0f} MB over the sequence")
        assert grown < 120, f"grew {grown:.0f} MB"
        assert served.get("/api/v1/runs/big/metrics")[1]["X-Metrics-Next"] == "50000"  # paged
        rows = json.loads(served.get("/api/v1/runs/big/metrics?since=149998")[2])
        assert [r["steps_completed"] for r in rows] == [149998, 149999]
    finally:
        served.stop()


@pytest.fixture
def small_server(tmp_path: pathlib.Path) -> Iterator[Any]:
    from determined_launch.ui.server import UiServer

    make_run(tmp_path / "det_runs")
    server = UiServer(("127.0.0.1", 0), Api([str(tmp_path / "det_runs")]), None,
                      idle_s=1.0, header_s=1.0, max_threads=4)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _get(port: int, path: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _closed(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except (TimeoutError, ConnectionResetError):
        return False


def test_idle_and_slow_connections_are_closed_and_threads_bounded(small_server: Any) -> None:
    port = small_server.server_address[1]
    threads = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"G")
    started = time.monotonic()
    assert _get(port, b"/api/v1/runs").startswith(b"HTTP/1.1 200")  # answered meanwhile
    assert time.monotonic() - started < 3
    assert threading.active_count() <= threads + 4 + 1
    for byte in b"ET / HTTP/1.1\r\n":  # a byte every 0.3 s: one deadline for the header
        try:
            slow.sendall(bytes([byte]))
        except OSError:
            break
        time.sleep(0.3)
    assert _closed(slow, 3)
    assert all(_closed(s, 3) for s in idle)  # idle ones closed after their deadline
    for s in [*idle, slow]:
        s.close()


def test_a_request_path_with_escapes_is_404_and_printed_escaped(
        small_server: Any, capfd: pytest.CaptureFixture[str]) -> None:
    port = small_server.server_address[1]
    for path in (b"\x1b]0;pwn\x07", b"/%1b]0;pwn%07", b"/api/v1/runs/%1b%5b2J/metrics"):
        assert _get(port, path).startswith(b"HTTP/1.1 404"), path
    assert "\x1b" not in capfd.readouterr().err


@pytest.mark.slow
def test_at_the_descriptor_limit_the_server_answers_and_does_not_spin(
        tmp_path: pathlib.Path) -> None:
    make_run(tmp_path / "det_runs")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.Popen([sys.executable, "-m", "determined_launch.cli", "ui", "--port", "0",
                             str(tmp_path / "det_runs")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, preexec_fn=limit, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().rsplit(":", 1)[1].strip("/\n"))
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
        time.sleep(0.5)
        def used() -> float:
            fields = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = used()
        time.sleep(2)
        assert used() - before < 0.5  # not spinning on accept
        assert _get(port, b"/api/v1/runs").startswith(b"HTTP/1.1 200")
        for s in held:
            s.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- §11 the mirror of a bucket -------------------------------------------------------------


def test_a_300_character_key_does_not_stop_the_mirror(
        tmp_path: pathlib.Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """And a tampered bucket's experiment.json naming an SQLite file elsewhere
    creates nothing (§3)."""
    from determined_launch.ui.remote import Mirror

    for var, value in {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(var, value)
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    line = b'{"steps_completed": 1, "metrics": {"x": 1}}\n'
    long_run = "r" * 300
    for run in ("a-before", long_run, "z-after"):
        s3.put_object(Bucket=bucket, Key=f"p/runs/{run}/training.jsonl", Body=line)
    exp = make_experiment(tmp_path, "ex")
    victim = tmp_path / "victim.db"
    record = {**json.loads((exp / "experiment.json").read_text()), "storage": f"sqlite:///{victim}"}
    s3.put_object(Bucket=bucket, Key="p/experiments/ex/study.journal",
                  Body=(exp / "study.journal").read_bytes())
    s3.put_object(Bucket=bucket, Key="p/experiments/ex/experiment.json",
                  Body=json.dumps(record).encode())
    mirror = Mirror(f"s3://{bucket}/p")
    try:
        mirror.first_sync()
        runs = sorted(p.name for p in (mirror.local / "runs").iterdir())
        assert runs[0] == "a-before" and runs[-1] == "z-after" and len(runs) == 3
        assert all(len(name) < 200 for name in runs)
        s3.put_object(Bucket=bucket, Key="p/runs/z-after/training.jsonl", Body=line * 2)
        mirror.sync()
        assert (mirror.local / "runs" / "z-after" / "training.jsonl").read_bytes() == line * 2
        [shown] = Api([str(mirror.local)]).experiments()
        assert shown["num_trials"] == 0 and "served directories" in shown["error"]
        assert not victim.exists()
    finally:
        mirror.close()


def test_a_trackers_error_text_is_printed_escaped_and_redacted(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """The MLflow warning line (core/trackers): the tracker server's text is
    outside text; its escapes never reach the operator's terminal."""
    import logging

    from determined_launch.core import trackers

    class Hostile:
        name = "mlflow"

        def start(self, resume_id: Any) -> str:
            raise RuntimeError("\x1b]0;pwned\x07\x1b[2J API error token=hunter2")

        def log(self, records: Any) -> None: ...

        def tag(self, tags: Any) -> None: ...

        def finish(self, state: str) -> None: ...

    state = trackers._State(tmp_path / "t.json", resuming=False)
    with caplog.at_level(logging.WARNING, logger="determined_launch.core"):
        sink = trackers.Sink(Hostile(), None, {}, state)
        sink.close("completed", time.monotonic() + 5)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "pwned" in text and "\x1b" not in text and "\x07" not in text
    assert "hunter2" not in text
