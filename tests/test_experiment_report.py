"""The experiment console's pure parts (experiment/report.py) on real Optuna trials:
one definition of a trial's metric everywhere, progress before the first
validation, plain numbers, and the plot."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import time
import warnings
from typing import Any, Optional

import pytest

from determined_launch.experiment import report
from determined_launch.experiment.driver import ATTR_BEAT, ATTR_OWNER
from determined_launch.experiment.trial import trial_metric
from determined_launch.values import plain, plain_metrics

optuna = pytest.importorskip("optuna", reason="the [search] extra is not installed")


def trial(number: int, values: dict[int, float], told: Optional[float] = None,
          state: str = "COMPLETE", **params: Any) -> Any:
    dist = optuna.distributions.FloatDistribution(0, 1000)
    t = optuna.trial.create_trial(
        params=params or {"x": float(number)}, distributions={k: dist for k in params or "x"},
        value=told if state == "COMPLETE" else None, intermediate_values=values,
        state=getattr(optuna.trial.TrialState, state))
    t.number = number
    return t


def table_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_the_table_the_record_and_the_study_use_the_best_validation(tmp_path: pathlib.Path
                                                                    ) -> None:
    # 3_hpsearch: x rises 10..100, smaller is better; the old driver told the study the
    # last value (100) while the table showed the best (10).
    rising = trial(3, {10: 10.0, 20: 50.0, 30: 100.0}, told=100.0)
    other = trial(1, {10: 20.0, 30: 30.0}, told=30.0)
    text = report.render_table([other, rising], "x", smaller=True)
    header, *body = table_rows(text)
    assert header[:5] == ["trial", "state", "best", "x", "(min)"]
    assert {r[0]: r[2] for r in body} == {"2": "20", "4": "10"}
    record = report.best_record([other, rising], tmp_path, "x", smaller=True)
    assert record is not None and (record["trial_id"], record["value"]) == (4, 10.0)
    # larger is better: the same reports rank the other way
    assert "best x (max)" in report.render_table([rising], "x", smaller=False)
    record = report.best_record([other, rising], tmp_path, "x", smaller=False)
    assert record is not None and (record["trial_id"], record["value"]) == (4, 100.0)


def test_trial_metric_is_the_best_finite_value() -> None:
    assert trial_metric([3.0, float("nan"), 1.0, 2.0], True) == 1.0
    assert trial_metric([3.0, float("nan"), 1.0], False) == 3.0
    assert trial_metric([float("nan")], True) is None
    assert trial_metric([], False) is None


def test_progress_is_shown_before_the_first_validation(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "trials" / "1"
    run_dir.mkdir(parents=True)
    lines = [{"steps_completed": s, "metrics": {"loss": 1.0}} for s in (10, 20, 30)]
    (run_dir / "training.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines)
                                            + '{"steps_comp')  # a line still being written
    (run_dir / "progress.jsonl").write_text('{"progress": 0.25}\n')
    running = trial(0, {}, state="RUNNING")
    running.user_attrs.update({ATTR_OWNER: f"{socket.gethostname()}:{os.getpid()}:0",
                               ATTR_BEAT: time.time()})  # its worker: this live process
    waiting = trial(1, {}, state="WAITING")
    header, first, second = table_rows(report.render_table([running, waiting], "loss", True,
                                                           tmp_path))
    assert "steps" in header
    assert first[:5] == ["1", "running", "-", "30", "(25%)"]
    # the PyTorch API's reports carry the epoch too
    with open(run_dir / "training.jsonl", "a") as f:
        f.write('ted": 0}\n{"steps_completed": 40, "metrics": {"batches": 40, "epochs": 2}}\n')
    row = table_rows(report.render_table([running], "loss", True, tmp_path))[1]
    assert row[3:6] == ["40", "(epoch", "2,"] and row[6] == "25%)", row
    assert second[:3] == ["2", "waiting", "-"] and second[3] == "-"


def test_a_running_trial_whose_worker_stopped_is_paused() -> None:
    """The study still says RUNNING after a preemption (the driver clears the
    owner) or a killed worker (its pid is gone, or its heartbeat is old)."""
    t = trial(0, {}, state="RUNNING")
    assert report.state_of(t) == "paused"  # no owner: preempted, resumable
    t.user_attrs.update({ATTR_OWNER: f"{socket.gethostname()}:{os.getpid()}:0",
                         ATTR_BEAT: time.time()})
    assert report.state_of(t) == "running"
    t.user_attrs[ATTR_OWNER] = "elsewhere:1:0"  # another host: only its heartbeat counts
    assert report.state_of(t) == "running"
    assert report.state_of(t, now=time.time() + 3600) == "paused"


def test_numbers_print_plain() -> None:
    np = pytest.importorskip("numpy")
    assert plain(np.float64(0.25)) == "0.25" and plain(np.int64(3)) == "3"
    assert plain(np.float32(1) / 3) == "0.333333" and plain(np.array(2.0)) == "2"
    assert plain(np.zeros((2, 3))) == "<ndarray shape=(2, 3)>"
    assert plain_metrics({"x": np.float64(100.0), "n": np.int64(7)}) == "x=100 n=7"
    row = report.rows([trial(0, {4: float(np.float64(0.5))}, 0.5, x=np.float64(2.5))], True)[0]
    assert "np." not in " ".join(row) and row[2] == "0.5" and row[4] == "x=2.5"


def test_core_logs_metrics_as_plain_numbers(tmp_path: pathlib.Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    np = pytest.importorskip("numpy")
    from determined_launch.core._dummy import _dummy_init

    ctx = _dummy_init(checkpoint_storage=str(tmp_path / "ckpt"))
    with caplog.at_level("INFO", logger="determined_launch.core"):
        ctx.train.report_validation_metrics(steps_completed=5, metrics={"x": np.float64(0.5)})
    text = caplog.text
    assert "x=0.5" in text and "np.float64" not in text, text


def test_the_plot_numbers_every_line_and_marks_the_best(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    trials = [trial(n, {8: 100.0 - n, 16: 50.0 - n}, told=50.0 - n) for n in range(16)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = report.plot(trials, tmp_path, "loss", smaller=True)
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    fig = report._figure(trials, "loss", smaller=True)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == [f"trial {n + 1}" for n in range(15)] + ["trial 16 (best)"]
    assert ax.get_legend() is not None and len(ax.get_legend().get_texts()) == 16
    colours = {line.get_color() if isinstance(line.get_color(), str) else
               tuple(line.get_color()) for line in ax.get_lines()}
    assert len(colours) == 16  # no colour repeats
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(n + 1) for n in range(16))
    assert "best: trial 16" in ax.get_title()


def test_no_data_no_plot_no_warning(tmp_path: pathlib.Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    failed = [trial(n, {}, state="FAIL") for n in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report.plot(failed, tmp_path, "loss") is None
    assert not (tmp_path / "searcher_metric.png").exists()
    assert list(tmp_path.iterdir()) == []
    assert "no plot: no trial reported 'loss'" in capsys.readouterr().out
