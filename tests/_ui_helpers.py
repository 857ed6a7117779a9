"""Fixture trees for det-launch ui's tests, written by the project's own writers:
the study through the experiment's storage (Optuna journal), run files through
core's ``RunDir``, checkpoints in the directory storage's layout."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from determined_launch.core._rundir import RunDir

SECRET = "hunter2-s3cr3t"
NAME = "exp-a"
#: the browser tests drive Debian's chromium (scripts/install_ui.sh), never a download
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _dist() -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    return {"lr": FloatDistribution(1e-4, 1.0, log=True),
            "width": CategoricalDistribution([32, 64])}


def make_experiment(root: pathlib.Path, name: str = NAME) -> pathlib.Path:
    """An ASHA experiment of four trials: completed (the best), stopped by
    ASHA, invalid hparams, and running (its owner this test process)."""
    import optuna

    from determined_launch.experiment import searchers as se

    exp = root / name
    (exp / "trials").mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps({
        "name": name, "storage": None, "storage_has_password": False,
        "searcher": {"name": "adaptive_asha", "metric": "loss", "smaller_is_better": True,
                     "max_trials": 4, "max_length": 100}}))
    storage = se.open_storage(None, str(exp / "study.journal"))
    study = optuna.create_study(study_name=name, storage=storage, direction="minimize")
    states = optuna.trial.TrialState
    owner = f"{socket.gethostname()}:{os.getpid()}:0"
    specs: list[tuple[Any, dict[str, Any], dict[int, float], dict[str, Any]]] = [
        (states.COMPLETE, {"lr": 0.01, "width": 32}, {50: 0.9, 100: 0.5}, {"det_restarts": 2}),
        (states.PRUNED, {"lr": 0.3, "width": 64}, {25: 3.0}, {}),
        (states.FAIL, {"lr": 0.5, "width": 32}, {}, {se.ATTR_INVALID: True}),
        (states.RUNNING, {"lr": 0.02, "width": 64}, {25: 1.5},
         {"det_owner": owner, "det_heartbeat": time.time(), "det_slot": 3}),
    ]
    for state, params, values, attrs in specs:
        study.add_trial(optuna.trial.create_trial(
            state=state, params=params, distributions=_dist(), intermediate_values=values,
            value=values[max(values)] if state == states.COMPLETE else None,
            user_attrs={se.ATTR_HPARAMS: params, **attrs}))
    for i, (_, params, values, _) in enumerate(specs, start=1):
        run = RunDir(exp / "trials" / str(i), trial_id=i, hparams=params)
        for step in range(10, 101 if i == 1 else 30, 10):
            run.append("training", {"steps_completed": step, "metrics": {"loss": 1.0 / step}})
        for step, value in sorted(values.items()):
            run.append("validation", {"steps_completed": step, "metrics": {"loss": value}})
        info = {"trial": {"trial_id": i, "hparams": {**params, "db_password": SECRET}},
                "latest_checkpoint": None}
        (run.path / "cluster_info.json").write_text(json.dumps(info))
        (run.path / "output.log").write_text(
            f"[rank=0] trial {i} says hello\n[rank=1] rank one line\n"
            "det-launch: job preempted after the workers acknowledged; resumable "
            "(exit status 75)\n")
    uuid = "0f5e1c2a-aaaa-4bbb-8ccc-123456789abc"
    ck = exp / "checkpoints" / uuid
    ck.mkdir(parents=True)
    (ck / "metadata.json").write_text(json.dumps({"steps_completed": 100,
                                                  "aws_secret_access_key": SECRET}))
    (ck / "state.bin").write_bytes(b"x" * 1000)
    RunDir(exp / "trials" / "1", trial_id=1).append(
        "checkpoints", {"storage_id": uuid, "steps_completed": 100})
    return exp


def make_run(root: pathlib.Path, name: str = "local") -> pathlib.Path:
    run = RunDir(root / name, trial_id=None)
    for step in (1, 2, 3):
        run.append("training", {"steps_completed": step, "metrics": {"loss": 4.0 - step}})
    run.write_pointer("status", {"status": f"training (token={SECRET})"})
    return run.path


class Served:
    """``det-launch ui`` as a user starts it: a subprocess on 127.0.0.1, port 0."""

    def __init__(self, *args: str, cwd: Optional[pathlib.Path] = None,
                 token: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "determined_launch.cli", "ui", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        assert self.proc.stdout is not None
        self.first_line = self.proc.stdout.readline().rstrip("\n")
        tail = r"\?token=([\w-]+)" if token else ""
        m = re.fullmatch(rf"det-launch ui: serving (http://127\.0\.0\.1:\d+/){tail}",
                         self.first_line)
        assert m, (self.first_line, self.proc.stderr.read() if self.proc.stderr else "")
        self.url = m.group(1)
        self.token = m.group(2) if token else None

    def get(self, path: str, headers: Optional[dict[str, str]] = None) -> tuple[int, Any, bytes]:
        req = urllib.request.Request(self.url + path.lstrip("/"), headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 (loopback)
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def post(self, path: str, headers: Optional[dict[str, str]] = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path.lstrip("/"), data=b"", method="POST",
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 (loopback)
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def playwright_or_skip() -> Any:
    """Playwright's sync API for a browser test module, or the module skipped."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev)")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no /usr/bin/chromium (bash scripts/install_ui.sh)", allow_module_level=True)
    return sync_api


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium (Playwright's Browser); closed at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def browsing(*args: str, cwd: Optional[pathlib.Path] = None,
             viewport: Optional[dict[str, int]] = None) -> Iterator[tuple[Served, Any]]:
    """``det-launch ui *args`` and one chromium tab (a module's fixture shares them:
    starting both costs seconds on a loaded machine); both stopped at the end."""
    served = Served(*args, cwd=cwd)
    try:
        with chromium() as browser:
            yield served, browser.new_page(viewport=viewport or {"width": 1280, "height": 900})
    finally:
        served.stop()
