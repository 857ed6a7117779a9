"""``det-launch ui`` at scale (issue 25's targets).

    python benchmarks/bench_ui.py [--trials 10000] [--points 1000000] [--tabs 20]
                                  [--chart-only] [--tree CHECKOUT] [--keep DIR]

Each measured against a real ``det-launch ui`` subprocess over HTTP on loopback:

* **experiment page data**: an experiment of ``--trials`` trials in a journal
  study (each with a trial directory: validation.jsonl, checkpoints.jsonl);
  the three requests the page makes (summary, trials, searcher_metric), cold
  (first request: the journal replayed; finished trials' file columns
  (checkpoints, restarts) then fill in from a background thread, timed too)
  and warm (the next poll). Beside it, Optuna alone on the same journal:
  ``optuna.load_study(...).get_trials()`` in a fresh process, and the UI's
  own journal reader (``ui/journal.py``) alone, also in a fresh process.
* **home page data**: ``/api/v1/experiments`` + ``/api/v1/runs``.
* **a 1,000,000-point chart**: a run whose training.jsonl has ``--points``
  reports; ``metrics?max_points=1000`` cold and warm, the server's RSS after;
  beside it, the UI's stream reader (``ui/files.py``) alone parsing that
  ``training.jsonl`` in a fresh process. ``--chart-only`` measures only this.
* **tabs following**: ``--tabs`` clients polling a trial page's requests
  each second (with If-None-Match, as the pages do) for 10 s while the run
  grows; the server's CPU time / wall time.

* **the cold path in phases** (``--phases``, with ``--keep DIR``): in one
  fresh process, no server and no browser, the work between a server's start
  and the experiment page's first three answers, one phase after the other,
  each phase's CPU seconds on its own thread (``time.thread_time``; the
  background filler of file columns is left out).

``--tree`` measures another checkout's server and readers (an old commit,
unpacked with ``git archive``) on the same fixtures, for before/after pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Optional

import psutil

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def build_experiment(root: pathlib.Path, n: int) -> None:
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from determined_launch.experiment import searchers as se

    exp = root / "det_experiments" / "big"
    (exp / "trials").mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps({
        "name": "big", "storage": None, "storage_has_password": False,
        "searcher": {"name": "random", "metric": "loss", "smaller_is_better": True,
                     "max_trials": n}}))
    storage = se.open_storage(None, str(exp / "study.journal"))
    study = optuna.create_study(study_name="big", storage=storage)
    dist = {"lr": FloatDistribution(1e-4, 1.0, log=True),
            "width": CategoricalDistribution([32, 64, 128])}
    trials = []
    for i in range(n):
        values = {25 * k: 1.0 / (k + 1) + i * 1e-6 for k in range(1, 5)}
        params = {"lr": 10 ** (-4 + 4 * (i % 97) / 97), "width": [32, 64, 128][i % 3]}
        trials.append(optuna.trial.create_trial(
            params=params, distributions=dist, intermediate_values=values,
            value=values[100], user_attrs={se.ATTR_HPARAMS: params}))
        d = exp / "trials" / str(i + 1)
        d.mkdir()
        with open(d / "validation.jsonl", "w") as f:
            for step, v in values.items():
                f.write(json.dumps({"steps_completed": step, "metrics": {"loss": v},
                                    "time": 1.0, "trial_id": i + 1}) + "\n")
        (d / "checkpoints.jsonl").write_text(json.dumps(
            {"storage_id": f"ck-{i}", "steps_completed": 100, "time": 1.0}) + "\n")
    study.add_trials(trials)


def build_run(root: pathlib.Path, points: int) -> pathlib.Path:
    run = root / "det_runs" / "long"
    run.mkdir(parents=True)
    with open(run / "training.jsonl", "w") as f:
        for i in range(points):
            f.write(f'{{"metrics": {{"loss": {1.0 / (i + 1):.6g}, "lr": 0.001}}, '
                    f'"steps_completed": {i + 1}, "time": {1.7e9 + i}, "trial_id": null}}\n')
    return run


class Server:
    def __init__(self, root: pathlib.Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "determined_launch.cli", "ui",
                                      "--port", "0"], cwd=root, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"(http://\S+/)", line)
        assert m, line
        self.url = m.group(1)
        self.ps = psutil.Process(self.proc.pid)
        self.preview = False  # whether the last answer was a chart preview

    def get(self, path: str, etag: Optional[str] = None) -> tuple[float, int, Optional[str]]:
        headers = {"If-None-Match": etag} if etag else {}
        t = time.perf_counter()
        req = urllib.request.Request(self.url + path.lstrip("/"), headers=headers)
        self.preview = False
        try:
            with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 (loopback)
                r.read()
                status, tag = r.status, r.headers.get("ETag")
                self.preview = r.headers.get("X-Metrics-Preview") is not None
        except urllib.error.HTTPError as e:
            status, tag = e.code, etag
        return time.perf_counter() - t, status, tag

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def timed(server: Server, paths: list[str]) -> float:
    return sum(server.get(p)[0] for p in paths)


def alone(root: pathlib.Path, setup: str, measured: str) -> float:
    """Seconds of ``measured`` (after ``setup``) in a fresh process."""
    code = f"import time; {setup}; t=time.perf_counter(); {measured}; print(time.perf_counter()-t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, cwd=root).stdout.split()[-1])


#: the experiment page's cold path, phase by phase, in a fresh process (--phases)
PHASES = """
import json, sys, time
t = time.thread_time()
from determined_launch.ui import routes, server  # noqa: F401 (what the server imports)
from determined_launch.ui.api import Api
import determined_launch.experiment.report  # noqa: F401 (imported by the first answer)
out = {"imports (before the URL is announced)": round(time.thread_time() - t, 3)}
api = Api([sys.argv[1]])
exp = api.catalog.experiments()["big"]
record = api._record(exp)
def phase(name, work):
    t = time.thread_time()
    work()
    out[name] = round(time.thread_time() - t, 3)
phase("the study (journal) read", lambda: api.studies.trials(exp, record))
phase("the summary answer", lambda: api.experiment_body("big", ""))
phase("10,000 rows and curves", lambda: api._entries("big"))
phase("the trials answer (encoded, ETag)", lambda: api.experiment_body("big", "trials"))
phase("the searcher_metric answer", lambda: api.experiment_body("big", "searcher_metric"))
after = [v for k, v in out.items() if "imports" not in k]
out["after the announcement, total"] = round(sum(after), 3)
print(json.dumps(out))
"""


def phases(root: pathlib.Path) -> dict[str, Any]:
    """The cold path's CPU seconds by phase (PHASES), in a fresh process of --tree."""
    return json.loads(subprocess.run(
        [sys.executable, "-c", PHASES, str(root / "det_experiments")], capture_output=True,
        text=True, check=True, cwd=root).stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--tabs", type=int, default=20)
    ap.add_argument("--keep", metavar="DIR", help="build the fixtures here once and reuse them")
    ap.add_argument("--chart-only", action="store_true",
                    help="only the million-point chart (no experiment, no tabs)")
    ap.add_argument("--phases", action="store_true",
                    help="only the cold path's CPU by phase, in-process (needs --keep's fixture)")
    ap.add_argument("--tree", metavar="CHECKOUT", default=str(REPO),
                    help="the checkout whose server and readers are measured")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = str(pathlib.Path(args.tree).resolve())  # servers and readers
    out: dict[str, Any] = {"tree": os.environ["PYTHONPATH"]}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(args.keep or tmp)
        run = root / "det_runs" / "long"
        t = time.perf_counter()
        if not args.chart_only and not (root / "det_experiments").exists():
            build_experiment(root, args.trials)
        if not run.exists() and not args.phases:
            build_run(root, args.points)
        print(f"fixtures ready in {time.perf_counter() - t:.1f} s", flush=True)
        if args.phases:
            print(json.dumps({**out, **phases(root)}, indent=1))
            return
        out["stream_reader_alone_s"] = alone(
            root, "from determined_launch.ui.files import Streams",
            f"n=len(Streams().get('{run}/training.jsonl', ['{root}']))")
        if not args.chart_only:
            journal = f"'{root}/det_experiments/big/study.journal'"
            out["optuna_alone_s"] = alone(
                root, "import optuna; optuna.logging.set_verbosity(optuna.logging.WARNING); "
                "from determined_launch.experiment import searchers as se",
                f"n=len(optuna.load_study(study_name='big', storage=se.open_storage(None, "
                f"{journal})).get_trials())")
            out["journal_reader_alone_s"] = alone(
                root, "pass", "from determined_launch.ui.journal import JournalReader; "
                f"n=len(JournalReader({journal}, 'big').trials())")
        if not args.chart_only:  # the home page as the first request after start
            server = Server(root)
            try:
                out["home_cold_s"] = timed(server, ["/api/v1/experiments", "/api/v1/runs"])
            finally:
                server.stop()
        server = Server(root)
        try:
            if args.chart_only:
                chart_only(server, out)
                return
            exp = ["/api/v1/experiments/big", "/api/v1/experiments/big/trials",
                   "/api/v1/experiments/big/searcher_metric"]
            t0 = time.perf_counter()
            out["experiment_cold_s"] = timed(server, exp)
            while True:  # finished trials' file columns arrive from a background thread
                with urllib.request.urlopen(server.url + "api/v1/experiments/big/trials",  # noqa: S310
                                            timeout=120) as r:
                    if all(row["checkpoints"] is not None for row in json.load(r)):
                        break
                time.sleep(0.5)
            out["file_columns_filled_s"] = time.perf_counter() - t0
            out["experiment_warm_s"] = min(timed(server, exp) for _ in range(3))
            home = ["/api/v1/experiments", "/api/v1/runs"]
            out["home_warm_s"] = min(timed(server, home) for _ in range(3))
            chart_only(server, out)
            print(json.dumps(out), flush=True)
            out["warm_up_done_after_s"], out["idle_cpu_pct"] = settle(server)
            out["tabs_cpu_pct"], out["tabs_worst_request_s"] = tabs(server, run, args.tabs)
        finally:
            server.stop()
            out.update(trials=args.trials, points=args.points, tabs=args.tabs)
            print(json.dumps(out, indent=1))


def chart_only(server: Server, out: dict[str, Any]) -> None:
    """The million-point chart's first request (with --chart-only, right after
    start: the request waits for the start-up read under way), then polls."""
    chart = "/api/v1/runs/long/metrics?group=training&max_points=1000"
    start = time.perf_counter()
    out["chart_cold_s"] = server.get(chart)[0]
    out["chart_cold_was_preview"] = server.preview
    while server.preview:  # as a page does: poll each second until the shape-keeping rows
        time.sleep(1.0)
        server.get(chart)
    out["chart_shape_keeping_after_s"] = time.perf_counter() - start
    out["chart_warm_s"] = min(server.get(chart)[0] for _ in range(3))
    out["rss_mib"] = server.ps.memory_info().rss / 2**20


def settle(server: Server, limit_s: float = 120.0) -> tuple[float, float]:
    """Wait for the server's start-up reads (warm-up: every stream, every
    study's importance) to end, so the tabs measure counts only the tabs:
    until a 2 s window with no requests costs < 2 % of a core. Returns the
    wait and that idle window's CPU %."""
    t = time.monotonic()
    while True:
        before, w = sum(server.ps.cpu_times()[:2]), time.monotonic()
        time.sleep(2.0)
        pct = 100 * (sum(server.ps.cpu_times()[:2]) - before) / (time.monotonic() - w)
        if pct < 2.0 or time.monotonic() - t > limit_s:
            return time.monotonic() - t, pct


def tabs(server: Server, run: pathlib.Path, n: int,
         seconds: float = 10.0) -> tuple[float, float]:
    """n clients polling a run page's requests each second while the run grows."""
    paths = ["/api/v1/runs/long", "/api/v1/runs/long/metrics?group=training&max_points=1000",
             "/api/v1/runs/long/checkpoints", "/api/v1/runs/long/logs"]
    stop = time.monotonic() + seconds

    worst = [0.0]

    def tab() -> None:
        tags: dict[str, Optional[str]] = {}
        while time.monotonic() < stop:
            for p in paths:
                took, _, tags[p] = server.get(p, tags.get(p))
                worst[0] = max(worst[0], took)
            time.sleep(1.0)

    def grow() -> None:
        i = 0
        while time.monotonic() < stop:
            with open(run / "training.jsonl", "a") as f:
                f.write(json.dumps({"metrics": {"loss": 1e-7}, "steps_completed": 2_000_000 + i,
                                    "time": 1.8e9 + i}) + "\n")
            i += 1
            time.sleep(0.5)

    before = sum(server.ps.cpu_times()[:2])
    threads = [threading.Thread(target=tab) for _ in range(n)] + [threading.Thread(target=grow)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return 100 * (sum(server.ps.cpu_times()[:2]) - before) / (time.monotonic() - t), worst[0]


if __name__ == "__main__":
    main()
