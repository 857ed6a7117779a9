"""Any metric of any group for the charts: which groups and names a run
reported, and one metric's points for many trials of an experiment at once.

Why: the experiment page plotted only the searcher metric (the study's
reports); a user's ``report_metrics`` groups live only in the trials' streams.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Callable, Optional

from determined_launch.ui.api import Api
from determined_launch.ui.runs import GROUP, RunReader

#: trials one request may name (the page draws the best 300 at most)
MAX_TRIALS = 300
#: points per trial's curve when many trials are drawn together
CURVE_POINTS = 500


def metric_names(reader: RunReader, run_dir: str) -> dict[str, list[str]]:
    """``{group: [numeric metric names]}`` of one run, training and validation first."""
    return {g: sorted(reader.table(run_dir, g).columns) for g in reader.groups(run_dir)}


def merged_names(reader: RunReader, run_dirs: Iterable[str]) -> dict[str, list[str]]:
    """``metric_names`` of several runs, united (a group keeps its first-seen order)."""
    out: dict[str, set[str]] = {}
    for run_dir in run_dirs:
        for group, names in metric_names(reader, run_dir).items():
            out.setdefault(group, set()).update(names)
    return {g: sorted(n) for g, n in out.items()}


def points(reader: RunReader, run_dir: str, group: str, metric: str,
           max_points: int = CURVE_POINTS) -> list[list[float]]:
    """``[[steps_completed, value], ...]`` of one metric (rows without it skipped)."""
    if not GROUP.match(group):
        return []
    out = []
    for row in reader.metrics(run_dir, group, max_points):
        value, step = row["metrics"].get(metric), row["steps_completed"]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                step is not None and math.isfinite(value):
            out.append([step, value])
    return out


def parse_trials(raw: Optional[str]) -> Optional[list[int]]:
    """``"1,2,5"`` -> ``[1, 2, 5]`` (at most MAX_TRIALS); None when absent; ValueError when bad."""
    if raw is None:
        return None
    ids = [int(p) for p in raw.split(",") if p.strip()]
    if len(ids) > MAX_TRIALS or any(i < 0 for i in ids):
        raise ValueError(f"trials: at most {MAX_TRIALS} non-negative trial ids")
    return ids


def experiment_curves(reader: RunReader, trial_dir: Callable[[int], Optional[str]],
                      ids: list[int], group: str, metric: str) -> list[dict[str, Any]]:
    """``[{"trial_id", "points"}]`` of one metric for the named trials (missing ones skipped)."""
    out = []
    for tid in ids[:MAX_TRIALS]:
        run_dir = trial_dir(tid)
        if run_dir is not None:
            out.append({"trial_id": tid, "points": points(reader, run_dir, group, metric)})
    return out


def experiment_names(api: Api, name: str, ids: Optional[list[int]]) -> Optional[dict[str, Any]]:
    """``{"groups": {group: [names]}}`` over the named trials (default: the first
    MAX_TRIALS), custom ``report_metrics`` groups included; None: no such experiment."""
    trials = api.trials(name)
    if trials is None:
        return None
    ids = [t["trial_id"] for t in trials][:MAX_TRIALS] if ids is None else ids
    dirs = (api.trial_dir(name, tid) for tid in ids)
    return {"groups": merged_names(api.runs_reader, (d for d in dirs if d is not None)),
            "categorical_hparams": categorical_hparams(api, name)}


def categorical_hparams(api: Api, name: str) -> list[str]:
    """Hyperparameters the search space declares categorical (Optuna's
    CategoricalDistribution), so a chart draws ``[32, 64]`` as two categories."""
    exp_dir = api.catalog.experiments().get(name)
    if exp_dir is None:
        return []
    study, _ = api._study(exp_dir, api._record(exp_dir))  # the study the trial rows come from
    found: set[str] = set()
    for t in study:  # ui/journal.py's Trial has kinds; Optuna's FrozenTrial distributions
        kinds = getattr(t, "kinds", None) or {}
        found.update(k for k, kind in kinds.items() if kind[0] == "categorical")
        dists = getattr(t, "distributions", None) or {}
        found.update(k for k, d in dists.items() if type(d).__name__ == "CategoricalDistribution")
    return sorted(found)


def experiment_metric(api: Api, name: str, group: str, metric: str,
                      ids: Optional[list[int]]) -> Optional[list[dict[str, Any]]]:
    """One metric of every named trial (default: the first MAX_TRIALS); None: no such experiment."""
    trials = api.trials(name)
    if trials is None:
        return None
    ids = [t["trial_id"] for t in trials][:MAX_TRIALS] if ids is None else ids
    return experiment_curves(api.runs_reader, lambda tid: api.trial_dir(name, tid), ids,
                             group, metric)
