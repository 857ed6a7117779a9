"""Determined's ``save_*`` retention, applied by the chief after each commit.

Only when the storage block configured a policy (``Retention``); otherwise
nothing is ever deleted. Each run deletes only checkpoints it committed
itself (recorded in ``<run_dir>/checkpoints.jsonl``), keeping the union of:

- the ``save_trial_latest`` newest ones (always at least the newest, which
  ``latest()`` resumes from);
- the ``save_trial_best`` best ones of this run;
- those among the ``save_experiment_best`` best of every run directory
  beside this one (the trials of one experiment share ``det_runs/``).

"Best" is the validation metric named by ``DET_SEARCHER_METRIC`` (lower is
better unless ``DET_SMALLER_IS_BETTER=false``) reported at the checkpoint's
``steps_completed`` (or the last report before it). Without a metric only
the latest are kept by rank; checkpoints without a metric value never count
as best.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any, Callable, Optional

from determined_launch import envvars, rundir
from determined_launch.core.storage.spec import Retention

__all__ = ["Retention", "apply", "to_delete"]

logger = logging.getLogger("determined_launch.core")

LOG_STREAM = rundir.CHECKPOINT_LOG
METRIC_ENV = envvars.SEARCHER_METRIC
SMALLER_ENV = envvars.SMALLER_IS_BETTER


def _read(path: pathlib.Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line after a crash
        if isinstance(record, dict):
            out.append(record)
    return out


def _metric_at(validations: list[dict[str, Any]], steps: Any, metric: str) -> Optional[float]:
    """The metric reported at ``steps`` (or the last report before it)."""
    best: Optional[tuple[int, float]] = None
    if not isinstance(steps, (int, float)):
        return None
    for record in validations:
        at = record.get("steps_completed")
        value = (record.get("metrics") or {}).get(metric)
        if not isinstance(at, (int, float)) or not isinstance(value, (int, float)):
            continue
        if at <= steps and not math.isnan(value) and (best is None or at >= best[0]):
            best = (int(at), float(value))
    return None if best is None else best[1]


def _live(run_dir: pathlib.Path, metric: Optional[str]) -> list[tuple[str, Optional[float]]]:
    """(storage id, metric value) of a run's checkpoints not yet deleted, oldest first."""
    records = _read(run_dir / f"{LOG_STREAM}.jsonl")
    deleted = {r["deleted"] for r in records if "deleted" in r}
    validations = _read(run_dir / "validation.jsonl") if metric else []
    out = []
    for r in records:
        sid = r.get("storage_id")
        if isinstance(sid, str) and sid not in deleted:
            value = _metric_at(validations, r.get("steps_completed"), metric) if metric else None
            out.append((sid, value))
    return out


def _best(entries: list[tuple[str, Optional[float]]], n: int, smaller: bool) -> set[str]:
    scored = [(v if smaller else -v, i, sid) for i, (sid, v) in enumerate(entries)
              if v is not None]
    return {sid for _, _, sid in sorted(scored)[:n]}


def to_delete(policy: Retention, run_dir: pathlib.Path,
              env: Optional[Mapping[str, str]] = None) -> list[str]:
    """Pure decision: which of this run's checkpoints the policy drops."""
    env = os.environ if env is None else env
    metric = env.get(METRIC_ENV) or None
    smaller = env.get(SMALLER_ENV, "true").strip().lower() not in ("0", "false", "no")
    mine = _live(run_dir, metric)
    if not mine:
        return []
    keep = {sid for sid, _ in mine[-max(1, policy.save_trial_latest):]}
    keep |= _best(mine, policy.save_trial_best, smaller)
    if policy.save_experiment_best and metric:
        everyone: list[tuple[str, Optional[float]]] = []
        for sibling in sorted(run_dir.parent.iterdir()) if run_dir.parent.is_dir() else []:
            if sibling.is_dir():
                everyone.extend(_live(sibling, metric))
        keep |= _best(everyone, policy.save_experiment_best, smaller)
    return [sid for sid, _ in mine if sid not in keep]


def apply(policy: Retention, run_dir: pathlib.Path, delete: Callable[[str], None],
          record: Callable[[Mapping[str, Any]], None]) -> list[str]:
    """Delete what the policy drops; a failed delete is a warning (retried next time)."""
    deleted = []
    for sid in to_delete(policy, run_dir):
        try:
            delete(sid)
        except FileNotFoundError:
            pass  # already gone
        except Exception as e:
            logger.warning("retention: could not delete checkpoint %s: %s", sid, e)
            continue
        record({"deleted": sid})
        deleted.append(sid)
    if deleted:
        logger.info("retention (%s): deleted %d checkpoint(s): %s", policy, len(deleted),
                    ", ".join(deleted))
    return deleted
