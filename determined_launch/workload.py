"""Test-compat: the type names Determined's test helpers annotate with.

Determined's legacy harness drove a trial with a stream of *workloads* (train
N batches, validate, checkpoint) sent by the master. There is no master and
no workload stream here: ``pytorch.Trainer`` and ``_PyTorchTrialController``
run their own loop. Determined's ``tests/experiment/utils.py`` names
``workload.Stream`` in signatures evaluated when it is imported, so the names
exist (as plain types) for that file to load; anything else is an
``AttributeError`` that says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: a workload stream (Determined: ``Iterator[Tuple[Workload, ResponseFunc]]``)
Stream = Iterator[Any]
#: a metrics dict as a workload response carries it
Metrics = dict[str, Any]


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"determined_launch.workload.{name}: Determined's legacy workloads do not exist here "
        "(only the type names Stream and Metrics, for Determined's test helpers); train "
        "with pytorch.Trainer or pytorch._PyTorchTrialController")
