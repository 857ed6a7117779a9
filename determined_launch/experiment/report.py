"""What a user watches: the trial table, the best trial, the plot.

All of it is computed from the study and the trials' run directories, so a
running experiment, a finished one and one whose trials ran as workers on
other machines look the same (``det-launch experiment --status DIR``).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch.common.redact import printable, redact
from determined_launch.experiment import searchers as se
from determined_launch.experiment.owners import ATTR_BEAT, ATTR_FAILED, ATTR_OWNER, owner_alive
from determined_launch.experiment.trial import (
    TrialProcess,
    latest_checkpoint,
    trial_metric,
    write_private,
)
from determined_launch.exproot import trial_id_of
from determined_launch.supervisor import stragglers
from determined_launch.values import plain

STATES = {"COMPLETE": "completed", "PRUNED": "stopped (ASHA)", "RUNNING": "running",
          "WAITING": "waiting", "FAIL": "failed"}


def state_of(t: Any, now: Optional[float] = None) -> str:
    """The trial's state in words. A trial the study still calls running whose
    worker stopped (preempted, paused from the WebUI, or its worker killed) is
    "paused": rerunning the experiment's command resumes it."""
    if t.user_attrs.get(se.ATTR_INVALID):
        return "invalid hparams"
    if t.state.name == "RUNNING" and t.user_attrs.get(ATTR_FAILED):
        return "failed"  # kept open for a rerun to retry (owners.py)
    if t.state.name == "RUNNING":
        owner = str(t.user_attrs.get(ATTR_OWNER, ""))
        beat = float(t.user_attrs.get(ATTR_BEAT, 0) or 0)
        if not owner or not owner_alive(owner, beat, time.time() if now is None else now):
            return "paused"
    return STATES.get(t.state.name, t.state.name.lower())


def visible(trials: Sequence[Any]) -> list[Any]:
    return [t for t in trials if not t.user_attrs.get(se.ATTR_SURPLUS)]


def hparams_of(t: Any) -> dict[str, Any]:
    """The searched hparams the trial saw (dotted paths), constants left out."""
    return dict(t.user_attrs.get(se.ATTR_HPARAMS) or t.params)


def best_value(t: Any, smaller: bool) -> Optional[float]:
    """The trial's searcher metric (``trial.trial_metric``): its best
    reported validation value, or what the study was told when it has no
    reports (a trial recorded by an older version). None for a trial that
    completed without reporting it (the study holds the worst value)."""
    values = list(t.intermediate_values.values())
    if not values and t.user_attrs.get(se.ATTR_NO_METRIC):
        return None
    if not values and t.value is not None:
        values.append(t.value)
    return trial_metric(values, smaller)


def metric_header(metric: str, smaller: bool) -> str:
    """The best column's name says which value it is: ``best loss (min)``."""
    return f"best {metric} ({'min' if smaller else 'max'})"


def progress_of(run_dir: Optional[pathlib.Path]) -> str:
    """How far a trial got, from its run directory: the newest
    ``steps_completed`` of a training or validation report (batches, for the
    PyTorch API), its ``epochs`` metric when there is one (the PyTorch API
    reports it), and the searcher progress when the script reports one:
    ``120 (epoch 2, 30%)``. Only each file's last line is read, so a long run
    costs the same."""
    if run_dir is None:
        return "-"
    newest = _newest_report(run_dir)
    progress = _last_record(run_dir / "progress.jsonl").get("progress")
    notes = []
    metrics = newest.get("metrics") if newest is not None else None
    if isinstance(metrics, dict) and _is_int(metrics.get("epochs")):
        notes.append(f"epoch {metrics['epochs']}")
    if isinstance(progress, (int, float)) and 0 <= progress <= 1:
        notes.append(f"{progress:.0%}")
    text = "-" if newest is None else str(newest["steps_completed"])
    return text + (f" ({', '.join(notes)})" if notes else "")


def steps_of(run_dir: pathlib.Path) -> Optional[int]:
    """The table's ``steps``: the newest reported ``steps_completed``."""
    newest = _newest_report(run_dir)
    return None if newest is None else int(newest["steps_completed"])


def _newest_report(run_dir: pathlib.Path) -> Optional[dict[str, Any]]:
    records = [_last_record(run_dir / f"{g}.jsonl") for g in ("training", "validation")]
    records = [r for r in records if _is_int(r.get("steps_completed"))]
    return max(records, key=lambda r: r["steps_completed"], default=None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _last_record(path: pathlib.Path, tail: int = 8192) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail))
            chunk = f.read()
    except OSError:
        return {}
    for line in reversed(chunk.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line still being written, or cut by the tail
        if isinstance(record, dict):
            return record
    return {}


def rows(trials: Sequence[Any], smaller: bool,
         exp_dir: Optional[pathlib.Path] = None) -> list[list[str]]:
    out = []
    for t in visible(trials):
        best = best_value(t, smaller)
        run_dir = None if exp_dir is None else exp_dir / "trials" / str(trial_id_of(t))
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(redact(hparams_of(t)).items()))
        out.append([str(trial_id_of(t)), state_of(t) + slow_ranks(run_dir),
                    "-" if best is None else plain(best), progress_of(run_dir), params])
    return out


def slow_ranks(run_dir: Optional[pathlib.Path], tail: int = 64 << 10) -> str:
    """``, straggler: rank 3 (node 1)`` while the launcher's last word on a rank
    (``stragglers.jsonl``, its last ``tail`` bytes) is that it is slow; else ``""``."""
    if run_dir is None:
        return ""
    try:
        with open(run_dir / "stragglers.jsonl", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            lines = f.read(tail).splitlines()
    except OSError:
        return ""
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError):
            continue  # a line cut by the tail, or not ours
    now = stragglers.summary(records)["now"]
    if not now:
        return ""
    return ", straggler: " + ", ".join(f"rank {e['rank']} (node {printable(e['node'])})"
                                     for e in now[:4]) + (
        f" and {len(now) - 4} more" if len(now) > 4 else "")


def render_table(trials: Sequence[Any], metric: str, smaller: bool,
                 exp_dir: Optional[pathlib.Path] = None) -> str:
    """One row per trial; ``steps`` is the newest reported ``steps_completed``
    (with the searcher progress when there is one), known before the first
    validation."""
    header = ["trial", "state", metric_header(metric, smaller), "steps", "hparams"]
    body = rows(trials, smaller, exp_dir)
    width = shutil.get_terminal_size((120, 20)).columns
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(4)]
    lines = []
    for r in [header, *body]:
        line = "  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4]
        lines.append(line[:width])
    return "\n".join(lines)


def best_trial(trials: Sequence[Any], smaller: bool) -> Optional[Any]:
    """The completed trial with the best metric (``best_value``)."""
    done = [(v, t) for t in visible(trials) if t.state.name == "COMPLETE"
            for v in [best_value(t, smaller)] if v is not None]
    if not done:
        return None
    return (min if smaller else max)(done, key=lambda vt: vt[0])[1]


def best_record(trials: Sequence[Any], exp_dir: pathlib.Path, metric: str,
                smaller: bool) -> Optional[dict[str, Any]]:
    t = best_trial(trials, smaller)
    if t is None:
        return None
    run_dir = exp_dir / "trials" / str(trial_id_of(t))
    return {"trial_id": trial_id_of(t), "hparams": _trial_hparams(run_dir, t),
            "metric": metric, "value": best_value(t, smaller),
            "checkpoint": latest_checkpoint(run_dir), "run_dir": str(run_dir)}


def _trial_hparams(run_dir: pathlib.Path, t: Any) -> dict[str, Any]:
    try:
        info = json.loads((run_dir / "cluster_info.json").read_text(encoding="utf-8"))
        return dict(info["trial"]["hparams"])
    except (OSError, ValueError, KeyError, TypeError):
        return dict(t.params)


def write_best(record: dict[str, Any], exp_dir: pathlib.Path) -> pathlib.Path:
    path = exp_dir / "best_trial.json"
    write_private(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def plot(trials: Sequence[Any], exp_dir: pathlib.Path, metric: str,
         smaller: bool = True) -> Optional[pathlib.Path]:
    """``searcher_metric.png`` (``_figure``). No reported values, no file, and
    one line says so; without matplotlib (the ``[search]`` extra) too."""
    if not any(t.intermediate_values for t in visible(trials)):
        print(f"det-launch experiment: no plot: no trial reported {metric!r}")
        return None
    try:
        fig = _figure(trials, metric, smaller)
    except ImportError:
        print("det-launch experiment: no plot: matplotlib is not installed "
              "(pip install 'determined_launch[search]')")
        return None
    path = exp_dir / "searcher_metric.png"
    fd, tmp = tempfile.mkstemp(dir=exp_dir, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:  # a crash mid-write leaves no half PNG under the name
        fig.savefig(f, format="png", dpi=80)
    os.replace(tmp, path)
    return path


def _figure(trials: Sequence[Any], metric: str, smaller: bool) -> Any:
    """The metric against length, one line per trial with its number at its
    end and in the legend, colours distinct up to 20 trials, the best trial
    (``best_trial``) thick, black and named in the title."""
    # the object API, not pyplot: no GUI backend, a second less to import
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawn = [t for t in visible(trials) if t.intermediate_values]
    best = best_trial(trials, smaller)
    many = len(drawn) > 20  # beyond tab20's colours a continuous map; the numbers tell apart
    cmap = colormaps["turbo" if many else "tab20"]
    fig = Figure(figsize=(9, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, t in enumerate(drawn):
        steps = sorted(t.intermediate_values)
        values = [t.intermediate_values[s] for s in steps]
        is_best = best is not None and t.number == best.number
        colour = "black" if is_best else cmap(i / (len(drawn) - 1) if many else i)
        ax.plot(steps, values, marker=".", color=colour, linewidth=3 if is_best else 1,
                zorder=3 if is_best else 2,
                label=f"trial {trial_id_of(t)}" + (" (best)" if is_best else ""))
        ax.annotate(str(trial_id_of(t)), (steps[-1], values[-1]), xytext=(3, 0),
                    textcoords="offset points", fontsize="small", va="center",
                    fontweight="bold" if is_best else "normal")
    title = f"{metric} by trial"
    if best is not None:
        title += f"; best: trial {trial_id_of(best)}, {metric}={plain(best_value(best, smaller))}"
    ax.set_xlabel("length")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize="x-small", ncol=1 + len(drawn) // 24, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def stopped_line(proc: TrialProcess, metric: str) -> str:
    """What ASHA stopped: the report it stopped the trial at and, when the trial
    trained on before the stop reached it, how far (the table's ``steps``)."""
    at = proc.stopped_at
    line = f"trial {proc.spec.trial_id}: stopped by ASHA"
    if at is not None:
        line += f" at length {at.length} ({metric}={plain(at.value)})"
    steps = steps_of(proc.dir)
    if steps is not None and (at is None or steps != at.length):
        line += f"; it stopped after {steps} steps"
    return line


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else plain(v)
