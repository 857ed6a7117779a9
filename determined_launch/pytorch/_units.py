"""Training lengths and periods (``Batch``, ``Epoch``) and the loop's boundary arithmetic.

Pure Python (no torch import): the controller loop asks these helpers whether a
period was reached after a batch, so the rules of spec 3.4 live in one place and
are unit-tested without a model.
"""

from __future__ import annotations

import collections.abc
import enum
import sys
from typing import Any, Optional, Union

UnitValue = Union[int, collections.abc.Container]


class _SearcherUnit(enum.Enum):
    """The searcher's length units (upstream ``core.Unit``); strings are accepted too."""

    EPOCHS = "epochs"
    RECORDS = "records"
    BATCHES = "batches"


class TrainUnit:
    """A training length or period.

    ``value`` is an int (a period: every ``value`` units; a value < 1 means
    "every time") or a container (an explicit schedule: stop at the listed
    unit counts, e.g. ``Batch([5, 30, 45])``).
    """

    def __init__(self, value: UnitValue) -> None:
        if isinstance(value, bool) or not (
            isinstance(value, int) or isinstance(value, collections.abc.Container)
        ):
            raise TypeError(
                f"{type(self).__name__}(value) takes an int or a container of ints, got {value!r}"
            )
        self.value = value

    def should_stop(self, step_num: int) -> bool:
        """True if ``step_num`` (1-based count of units done) reaches this period."""
        if isinstance(self.value, int):
            return self._divides(step_num)
        return step_num in self.value

    def _divides(self, steps: int) -> bool:
        if not isinstance(self.value, int):
            raise TypeError(f"{self!r} is a schedule, not a period")
        if self.value < 1:
            return True
        if steps == 0:
            return False
        return steps % self.value == 0

    @staticmethod
    def _from_searcher_unit(
        length: int, unit: Any, global_batch_size: Optional[int] = None
    ) -> TrainUnit:
        name = _unit_name(unit)
        if name == "epochs":
            return Epoch(length)
        if name == "batches":
            return Batch(length)
        if name == "records":
            if global_batch_size is None:
                raise ValueError("a length in records needs global_batch_size to convert it")
            return Batch._from_records(length, global_batch_size)
        raise ValueError(f"unknown searcher unit {unit!r}; use batches, records or epochs")

    @staticmethod
    def _from_values(
        batches: Optional[int] = None,
        records: Optional[int] = None,
        epochs: Optional[int] = None,
        global_batch_size: Optional[int] = None,
    ) -> TrainUnit:
        """Build a unit from an experiment-config dict such as ``{"batches": 100}``.

        Exactly one of the three must be set; a value < 1 means "never"
        (``sys.maxsize``), which is how ``min_validation_period: {batches: 0}``
        reads upstream.
        """
        given = [x for x in (batches, records, epochs) if x is not None]
        if len(given) != 1:
            raise ValueError(
                "exactly one of batches, records or epochs must be set, got "
                f"batches={batches!r}, records={records!r}, epochs={epochs!r}"
            )
        value = given[0]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"a training length must be an int, got {value!r}")
        if value < 1:
            value = sys.maxsize
        if batches is not None:
            return Batch(value)
        if epochs is not None:
            return Epoch(value)
        if global_batch_size is None:
            raise ValueError("a length in records needs global_batch_size to convert it")
        return Batch._from_records(value, global_batch_size)

    def _to_searcher_unit(self) -> _SearcherUnit:
        if isinstance(self, Batch):
            return _SearcherUnit.BATCHES
        if isinstance(self, Epoch):
            return _SearcherUnit.EPOCHS
        raise ValueError(f"{type(self).__name__} has no searcher unit; use Batch or Epoch")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrainUnit):
            return NotImplemented
        return type(self) is type(other) and self.value == other.value

    def __hash__(self) -> int:
        try:
            return hash((type(self).__name__, self.value))
        except TypeError:
            return hash(type(self).__name__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"


class Epoch(TrainUnit):
    """A length or period in epochs (passes over the chief's training loader)."""


class Batch(TrainUnit):
    """A length or period in batches (global batches, i.e. optimizer-loop iterations)."""

    @staticmethod
    def _from_records(records: int, global_batch_size: int) -> Batch:
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        return Batch(max(records // global_batch_size, 1))


def _unit_name(unit: Any) -> str:
    if isinstance(unit, str):
        return unit.lower()
    name = getattr(unit, "name", None)
    if isinstance(name, str):
        return name.lower()
    return str(unit).lower()


# Seed-002 aliases (``det.Epochs(1)``, ``det.Batches(100)``).
Epochs = Epoch
Batches = Batch


class _TrainBoundaryType(enum.Enum):
    CHECKPOINT = "CHECKPOINT"
    REPORT = "REPORT"
    VALIDATE = "VALIDATE"
    TRAIN = "TRAIN"


class _TrainBoundary:
    """One period the loop watches; ``limit_reached`` is set when a batch hits it."""

    def __init__(self, step_type: _TrainBoundaryType, unit: TrainUnit) -> None:
        self.step_type = step_type
        self.unit = unit
        self.limit_reached = False

    def __repr__(self) -> str:
        return (
            f"_TrainBoundary({self.step_type.name}, {self.unit!r}, "
            f"limit_reached={self.limit_reached})"
        )


def unit_reached(
    unit: TrainUnit, batch_idx: int, epoch_len: int, *, test_mode: bool = False
) -> bool:
    """Whether finishing batch ``batch_idx`` (0-based, global) reaches ``unit``.

    ``Batch``: ``unit.should_stop(batch_idx + 1)``. ``Epoch``: only on the last
    batch of an epoch, with ``unit.should_stop(epoch_idx + 1)``. Periods are
    absolute (counted from batch 0), so a resumed run meets the same boundaries.
    """
    del test_mode  # test mode is handled for TRAIN only, see check_boundaries
    if isinstance(unit, Batch):
        return unit.should_stop(batch_idx + 1)
    if isinstance(unit, Epoch):
        if epoch_len < 1:
            raise ValueError(f"epoch_len must be >= 1, got {epoch_len}")
        epoch_idx, in_epoch = divmod(batch_idx, epoch_len)
        return in_epoch == epoch_len - 1 and unit.should_stop(epoch_idx + 1)
    raise TypeError(f"expected a Batch or Epoch, got {type(unit).__name__}")


def check_boundaries(
    boundaries: list[_TrainBoundary], batch_idx: int, epoch_len: int, *, test_mode: bool = False
) -> bool:
    """Set ``limit_reached`` on each boundary that batch ``batch_idx`` reaches.

    Returns True if any was reached (the workload ends). In test mode the TRAIN
    boundary is reached after every batch.
    """
    any_reached = False
    count = batch_idx + 1
    for boundary in boundaries:
        unit = boundary.unit
        value = unit.value
        if test_mode and boundary.step_type is _TrainBoundaryType.TRAIN:
            reached = True
        elif type(unit) is Batch and type(value) is int:
            # The per-batch common case, inlined (same rule as TrainUnit._divides).
            reached = value < 1 or count % value == 0
        else:
            reached = unit_reached(unit, batch_idx, epoch_len)
        if reached:
            boundary.limit_reached = True
            any_reached = True
    return any_reached


def next_boundary(
    boundaries: list[_TrainBoundary], count: int, epoch_len: int, *, test_mode: bool = False
) -> int:
    """The smallest batch count after ``count`` at which ``check_boundaries`` can
    find a boundary reached (``count + 1`` where that is not known in advance:
    explicit schedules, test mode), so the loop tests only there."""
    nearest = None
    for boundary in boundaries:
        unit, value = boundary.unit, boundary.unit.value
        if test_mode and boundary.step_type is _TrainBoundaryType.TRAIN:
            return count + 1
        if type(value) is not int:
            return count + 1
        if type(unit) is Batch:
            period = max(value, 1)
        elif type(unit) is Epoch and epoch_len >= 1:
            period = max(value, 1) * epoch_len
        else:
            return count + 1
        at = (count // period + 1) * period
        nearest = at if nearest is None else min(nearest, at)
    return count + 1 if nearest is None else nearest


def remaining(max_length: TrainUnit, batches_trained: int, epochs_trained: int) -> int:
    """Units left before ``max_length`` (<= 0 means done)."""
    if not isinstance(max_length.value, int):
        raise TypeError(f"max_length must be a Batch or Epoch with an int, got {max_length!r}")
    if isinstance(max_length, Batch):
        return max_length.value - batches_trained
    if isinstance(max_length, Epoch):
        return max_length.value - epochs_trained
    raise TypeError(f"max_length must be a Batch or Epoch, got {type(max_length).__name__}")


def should_stop(unit: TrainUnit, batches_trained: int, epochs_trained: int, epoch_len: int) -> bool:
    """Whether training of length ``unit`` is complete at these counters."""
    del epoch_len  # epochs_trained is already counted by the loop (3.4)
    return remaining(unit, batches_trained, epochs_trained) <= 0


def progress(max_length: TrainUnit, batches_trained: int, epochs_trained: int) -> float:
    """Searcher progress in [0, 1] (the core ``report_progress`` rejects > 1)."""
    if not isinstance(max_length.value, int) or max_length.value < 1:
        return 0.0
    done = batches_trained if isinstance(max_length, Batch) else epochs_trained
    return min(max(done / max_length.value, 0.0), 1.0)


def epoch_position(batch_idx: int, epoch_len: int) -> tuple[int, int]:
    """``(epoch_idx, index_in_epoch)`` of a global batch index."""
    if epoch_len < 1:
        raise ValueError(f"epoch_len must be >= 1, got {epoch_len}")
    return divmod(batch_idx, epoch_len)


def is_epoch_start(batch_idx: int, epoch_len: int) -> bool:
    return batch_idx % epoch_len == 0


def is_epoch_end(batch_idx: int, epoch_len: int) -> bool:
    return batch_idx % epoch_len == epoch_len - 1
