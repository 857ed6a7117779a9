"""Large experiments at once (issue 36 §3): an unchanged poll builds nothing.

Counts builds, never time (the timings are benchmarks/bench_ui_browser.py's)."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import time
from typing import Any

from determined_launch.ui.api import Api

NAME = "quiet"


def _trial(i: int, state: Any = None, attrs: Any = None) -> Any:
    import optuna
    from optuna.distributions import FloatDistribution

    from determined_launch.experiment import searchers as se

    states = optuna.trial.TrialState
    state = states.COMPLETE if state is None else state  # RUNNING is 0
    params = {"lr": 0.001 * (i + 1)}
    return optuna.trial.create_trial(
        state=state, params=params, distributions={"lr": FloatDistribution(1e-4, 1.0)},
        intermediate_values={10: 1.0 / (i + 1)},
        value=1.0 / (i + 1) if state == states.COMPLETE else None,
        user_attrs={se.ATTR_HPARAMS: params, **(attrs or {})})


def _experiment(root: pathlib.Path, n: int) -> Any:
    import optuna

    from determined_launch.experiment import searchers as se

    exp = root / NAME
    (exp / "trials").mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps({
        "name": NAME, "storage": None, "storage_has_password": False,
        "searcher": {"name": "random", "metric": "loss", "smaller_is_better": True,
                     "max_trials": n + 1}}))
    storage = se.open_storage(None, str(exp / "study.journal"))
    study = optuna.create_study(study_name=NAME, storage=storage)
    for i in range(n):
        study.add_trial(_trial(i))
        (exp / "trials" / str(i + 1)).mkdir()
    return study


def _all(api: Api) -> dict[str, tuple[bytes, str]]:
    out = {}
    for part in api.PARTS:
        got = api.experiment_body(NAME, part)
        assert got is not None, part
        out[part] = got
    return out


def test_an_unchanged_poll_builds_no_answer(tmp_path: pathlib.Path) -> None:
    study = _experiment(tmp_path, 3)
    api = Api([str(tmp_path)])
    _all(api)
    deadline = time.monotonic() + 10  # finished trials' file columns come from a thread
    while api.rows.filled < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    first = _all(api)  # made after the fill: kept
    builds = api.bodies.builds
    for _ in range(5):
        assert _all(api) == first
    assert api.bodies.builds == builds  # five polls of four answers: none built
    assert json.loads(first["trials"][0])[0]["checkpoints"] == 0

    study.add_trial(_trial(3))  # the study changed: built again, and it shows
    (tmp_path / NAME / "trials" / "4").mkdir()
    after = _all(api)
    assert api.bodies.builds > builds
    assert len(json.loads(after["trials"][0])) == 4 and after["trials"][1] != first["trials"][1]
    assert json.loads(after[""][0])["num_trials"] == 4


def test_a_running_trials_answers_are_never_kept(tmp_path: pathlib.Path) -> None:
    import optuna

    study = _experiment(tmp_path, 2)
    owner = f"{socket.gethostname()}:{os.getpid()}:0"  # alive: this process
    study.add_trial(_trial(2, optuna.trial.TrialState.RUNNING,
                           {"det_owner": owner, "det_heartbeat": time.time()}))
    api = Api([str(tmp_path)])
    _all(api)
    deadline = time.monotonic() + 10
    while api.rows.filled < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    _all(api)
    builds = api.bodies.builds
    _all(api)
    # the summary and both tables depend on the clock; importance only on the study
    assert api.bodies.builds - builds == 3
    assert json.loads(api.experiment_body(NAME, "")[0])["state"] == "running"  # type: ignore[index]


def test_unchanged_polls_over_http_are_304_without_a_build(tmp_path: pathlib.Path) -> None:
    """The server sends the kept answer's ETag: a 304 needs no body built or hashed."""
    import threading
    import urllib.error
    import urllib.request

    from determined_launch.ui.server import serve

    _experiment(tmp_path, 2)
    api = Api([str(tmp_path)])
    server = serve(api, "127.0.0.1", 0, None, lambda url: None)

    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/experiments/{NAME}/trials"
    try:
        _all(api)
        deadline = time.monotonic() + 10
        while api.rows.filled < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        with urllib.request.urlopen(url) as r:  # noqa: S310 (loopback)
            etag = r.headers["ETag"]
        builds = api.bodies.builds
        req = urllib.request.Request(url, headers={"If-None-Match": etag})
        try:
            urllib.request.urlopen(req)  # noqa: S310
            raise AssertionError("not 304")
        except urllib.error.HTTPError as e:
            assert e.code == 304
        assert api.bodies.builds == builds
    finally:
        server.shutdown()
        server.server_close()


def test_two_asks_for_one_answer_build_it_once() -> None:
    """A cold 10,000-trial answer is seconds of CPU: a second tab (or the
    warm-up) asking meanwhile takes the first one's answer."""
    import threading

    from determined_launch.ui.bodies import Bodies

    bodies, started, release = Bodies(), threading.Event(), threading.Event()

    def build() -> tuple[bytes, bool]:
        started.set()
        release.wait(10)
        return b"[1]", True

    got: list[Any] = []
    first = threading.Thread(target=lambda: got.append(bodies.get("k", ("sig",), build)))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: got.append(bodies.get("k", ("sig",), build)))
    second.start()
    time.sleep(0.1)
    release.set()
    first.join(10)
    second.join(10)
    assert bodies.builds == 1 and len(got) == 2 and got[0] == got[1]


def test_background_work_waits_while_a_page_waits_for_an_answer() -> None:
    """The trials' file columns and importance wait (bounded) while an
    answer a page waits for is made: they share one interpreter."""
    import threading

    from determined_launch.ui.bodies import FOREGROUND, Bodies

    inside, release, order = threading.Event(), threading.Event(), []

    def build() -> tuple[bytes, bool]:
        inside.set()
        release.wait(10)
        order.append("answer")
        return b"{}", True

    page = threading.Thread(target=lambda: Bodies().get("k", ("s",), build))
    page.start()
    assert inside.wait(10)
    def work() -> None:
        FOREGROUND.wait_quiet(limit=10.0)
        order.append("background")

    background = threading.Thread(target=work)
    background.start()
    time.sleep(0.2)
    assert order == []  # still waiting
    release.set()
    page.join(10)
    background.join(10)
    assert order == ["answer", "background"]
    FOREGROUND.wait_quiet(limit=0.0)  # never waits past its limit; nor for its own thread
    with FOREGROUND.busy():
        FOREGROUND.wait_quiet(limit=10.0)


def test_numeric_hparams_fast_path_redacts_like_the_general_walk() -> None:
    from determined_launch.ui import shape
    from determined_launch.ui.trial_rows import _hparams

    for hp in ({"lr": 0.1, "width": 64, "flag": True, "none": None},
               {"lr": float("nan"), "b": float("inf")},
               {"api_token": 123, "lr": 0.5},  # a secret-looking key: hidden
               {"url": "https://user:pw@host/x", "n": 1},
               {"nested": {"password": 1}}):
        assert _hparams(dict(hp)) == shape.finite(shape.redact(dict(hp))), hp


def test_the_study_is_read_while_importance_opens_optunas_storage(
        tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    """Optuna's replay of a 10,000-trial journal (for importance) is seconds:
    the page's answers read the study meanwhile, never behind it."""
    import threading

    from determined_launch.ui.study import Studies

    _experiment(tmp_path, 3)
    api = Api([str(tmp_path)])
    exp = str(tmp_path / NAME)
    record = api._record(exp)
    opening, release = threading.Event(), threading.Event()
    real_load = Studies._load

    def slow_load(self: Studies, exp_dir: str, rec: dict[str, Any]) -> Any:
        opening.set()
        release.wait(20)  # Optuna replaying the journal
        return real_load(self, exp_dir, rec)

    monkeypatch.setattr(Studies, "_load", slow_load)
    importance = threading.Thread(target=api.studies.importance, args=(exp, record))
    importance.start()
    try:
        assert opening.wait(20)
        time.sleep(0.6)  # past the 0.5 s reuse of the last read
        read: list[int] = []
        reader = threading.Thread(target=lambda: read.append(len(
            api.studies.trials(exp, record))))
        reader.start()
        reader.join(5)
        assert read == [3]  # answered while the storage was still opening
    finally:
        release.set()
        importance.join(20)
