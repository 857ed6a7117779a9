"""``CheckpointPolicy``: whether a validation earns a checkpoint (spec 3.9).

"all", "none", or "best": the searcher metric better than the best so far
(the master's answer where there is one, else this run directory's).
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

import numpy as np

from determined_launch.core._rundir import read_jsonl


class CheckpointPolicy:
    def __init__(
        self, policy: str, searcher_metric_name: Optional[str], smaller_is_better: bool,
        core_context: Any,
    ) -> None:
        self.ckpt_policy = policy
        self.searcher_metric_name = searcher_metric_name
        self.smaller_is_better = smaller_is_better
        self.core_context = core_context

    def wants_checkpoint(self, metrics: dict[str, Any], checkpoint_is_current: bool) -> bool:
        """After a validation with ``metrics``: checkpoint now?"""
        if self.ckpt_policy == "none":
            return False
        if self.ckpt_policy == "all" or self.searcher_metric_name is None:
            return not checkpoint_is_current
        value = self._searcher_value(metrics, self.searcher_metric_name)
        best = self._best_validation()  # asked even when current, as upstream
        if checkpoint_is_current:
            return False
        if best is None:
            return True
        return value < best if self.smaller_is_better else value > best

    @staticmethod
    def _searcher_value(metrics: dict[str, Any], name: str) -> float:
        if name not in metrics:
            raise RuntimeError(
                f"Search method is configured to use metric '{name}' but model definition "
                f"returned validation metrics {list(metrics.keys())}. The metric used by the "
                "search method must be one of the validation metrics returned by the model "
                "definition."
            )
        value = metrics[name]
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            raise RuntimeError(
                f"Searcher validation metric '{name}' returned a non-scalar value: {value!r}"
            )
        return float(value)  # type: ignore[arg-type]

    def _best_validation(self) -> Optional[float]:
        """Best searcher metric so far: the master's answer where there is one
        (``train.get_experiment_best_validation``), else this run directory's."""
        ask = getattr(self.core_context.train, "get_experiment_best_validation", None)
        best = ask() if ask is not None else None
        if best is not None:  # off-cluster the Core API answers None: no master
            return float(best)
        run_dir = getattr(self.core_context, "run_dir", None)
        if run_dir is None or self.searcher_metric_name is None:
            return None
        try:
            records = read_jsonl(f"{run_dir}/validation.jsonl")
        except FileNotFoundError:
            return None
        values = [
            r["metrics"][self.searcher_metric_name] for r in records
            if isinstance(r.get("metrics"), dict)
            and isinstance(r["metrics"].get(self.searcher_metric_name), (int, float))
        ]
        if not values:
            return None
        return float(min(values) if self.smaller_is_better else max(values))
