"""What a user watches: the trial table, the best trial, the plot.

All of it is computed from the study and the trials' run directories, so a
running experiment, a finished one and one whose trials ran as workers on
other machines look the same (``det-launch experiment --status DIR``).
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch.experiment import searchers as se
from determined_launch.experiment.trial import latest_checkpoint, write_private

STATES = {"COMPLETE": "completed", "PRUNED": "stopped (ASHA)", "RUNNING": "running",
          "WAITING": "waiting", "FAIL": "failed"}


def state_of(t: Any) -> str:
    if t.user_attrs.get(se.ATTR_INVALID):
        return "invalid hparams"
    return STATES.get(t.state.name, t.state.name.lower())


def visible(trials: Sequence[Any]) -> list[Any]:
    return [t for t in trials if not t.user_attrs.get(se.ATTR_SURPLUS)]


def hparams_of(t: Any) -> dict[str, Any]:
    """The searched hparams the trial saw (dotted paths), constants left out."""
    return dict(t.user_attrs.get(se.ATTR_HPARAMS) or t.params)


def best_value(t: Any, smaller: bool) -> Optional[float]:
    values = [v for v in t.intermediate_values.values() if not math.isnan(v)]
    if t.value is not None:
        values.append(t.value)
    if not values:
        return None
    return min(values) if smaller else max(values)


def rows(trials: Sequence[Any], smaller: bool) -> list[list[str]]:
    out = []
    for t in visible(trials):
        best = best_value(t, smaller)
        length = max(t.intermediate_values) if t.intermediate_values else 0
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(hparams_of(t).items()))
        out.append([str(t.number + 1), state_of(t), "-" if best is None else f"{best:.6g}",
                    str(length), params])
    return out


def render_table(trials: Sequence[Any], metric: str, smaller: bool) -> str:
    header = ["trial", "state", f"best {metric}", "length", "hparams"]
    body = rows(trials, smaller)
    width = shutil.get_terminal_size((120, 20)).columns
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(4)]
    lines = []
    for r in [header, *body]:
        line = "  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4]
        lines.append(line[:width])
    return "\n".join(lines)


def best_trial(trials: Sequence[Any], smaller: bool) -> Optional[Any]:
    done = [t for t in visible(trials) if t.state.name == "COMPLETE" and t.value is not None]
    if not done:
        return None
    return (min if smaller else max)(done, key=lambda t: t.value)


def best_record(trials: Sequence[Any], exp_dir: pathlib.Path, metric: str,
                smaller: bool) -> Optional[dict[str, Any]]:
    t = best_trial(trials, smaller)
    if t is None:
        return None
    run_dir = exp_dir / "trials" / str(t.number + 1)
    return {"trial_id": t.number + 1, "hparams": _trial_hparams(run_dir, t),
            "metric": metric, "value": t.value, "checkpoint": latest_checkpoint(run_dir),
            "run_dir": str(run_dir)}


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


def plot(trials: Sequence[Any], exp_dir: pathlib.Path, metric: str) -> Optional[pathlib.Path]:
    """``searcher_metric.png``: the metric against length, one line per trial.
    Without matplotlib (the ``[search]`` extra) there is no plot, and one
    line says so."""
    try:  # the object API, not pyplot: no GUI backend, a second less to import
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("det-launch: no plot: matplotlib is not installed "
              "(pip install 'determined_launch[search]')")
        return None
    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for t in visible(trials):
        if not t.intermediate_values:
            continue
        steps = sorted(t.intermediate_values)
        ax.plot(steps, [t.intermediate_values[s] for s in steps], marker=".",
                label=f"trial {t.number + 1}" if len(trials) <= 12 else None)
    ax.set_xlabel("length")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by trial")
    if len(trials) <= 12:
        ax.legend(fontsize="small")
    path = exp_dir / "searcher_metric.png"
    fig.savefig(path, dpi=80)
    return path


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
