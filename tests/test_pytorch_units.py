"""Train units and the loop's boundary arithmetic (spec 2.5, 3.4)."""

from __future__ import annotations

import sys

import pytest

from determined_launch.pytorch import _units
from determined_launch.pytorch._units import (
    Batch,
    Epoch,
    TrainUnit,
    _TrainBoundary,
    _TrainBoundaryType,
    check_boundaries,
    progress,
    remaining,
    should_stop,
    unit_reached,
)


def test_divides_rules() -> None:
    assert Batch(0)._divides(7)  # value < 1: every time
    assert Batch(-3)._divides(0)
    assert not Batch(5)._divides(0)
    assert Batch(5)._divides(10)
    assert not Batch(5)._divides(11)


def test_should_stop_int_and_container() -> None:
    assert Batch(4).should_stop(8)
    assert not Batch(4).should_stop(6)
    schedule = Batch([5, 30, 45])
    assert [n for n in range(1, 50) if schedule.should_stop(n)] == [5, 30, 45]
    assert Epoch({2}).should_stop(2) and not Epoch({2}).should_stop(4)


def test_bad_values_raise_type_error() -> None:
    with pytest.raises(TypeError, match="int or a container"):
        Batch(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Batch(True)
    with pytest.raises(TypeError, match="schedule"):
        Batch([1, 2])._divides(3)


def test_from_values() -> None:
    assert TrainUnit._from_values(batches=100) == Batch(100)
    assert TrainUnit._from_values(epochs=3) == Epoch(3)
    assert TrainUnit._from_values(records=100, global_batch_size=32) == Batch(3)
    assert TrainUnit._from_values(records=10, global_batch_size=32) == Batch(1)  # at least 1
    assert TrainUnit._from_values(batches=0) == Batch(sys.maxsize)  # 0 = never
    assert TrainUnit._from_values(epochs=-1) == Epoch(sys.maxsize)
    with pytest.raises(ValueError, match="exactly one"):
        TrainUnit._from_values(batches=1, epochs=1)
    with pytest.raises(ValueError, match="exactly one"):
        TrainUnit._from_values()
    with pytest.raises(ValueError, match="global_batch_size"):
        TrainUnit._from_values(records=100)


def test_searcher_units_round_trip() -> None:
    assert TrainUnit._from_searcher_unit(7, "batches") == Batch(7)
    assert TrainUnit._from_searcher_unit(7, _units._SearcherUnit.EPOCHS) == Epoch(7)
    assert TrainUnit._from_searcher_unit(64, "RECORDS", global_batch_size=8) == Batch(8)
    assert Batch(3)._to_searcher_unit() is _units._SearcherUnit.BATCHES
    assert Epoch(3)._to_searcher_unit() is _units._SearcherUnit.EPOCHS
    with pytest.raises(ValueError, match="unknown searcher unit"):
        TrainUnit._from_searcher_unit(1, "minutes")
    with pytest.raises(ValueError, match="no searcher unit"):
        TrainUnit(3)._to_searcher_unit()


def test_aliases_and_equality() -> None:
    assert _units.Epochs is Epoch and _units.Batches is Batch
    assert Batch(3) == Batch(3) and Batch(3) != Epoch(3)
    assert hash(Batch(3)) == hash(Batch(3))
    assert repr(Epoch(2)) == "Epoch(2)"


def test_boundary_object() -> None:
    b = _TrainBoundary(_TrainBoundaryType.VALIDATE, Batch(5))
    assert b.step_type is _TrainBoundaryType.VALIDATE and not b.limit_reached
    assert {t.name for t in _TrainBoundaryType} == {"CHECKPOINT", "REPORT", "VALIDATE", "TRAIN"}


def test_unit_reached_batches_is_absolute() -> None:
    # Periods count from batch 0, so a run resumed at batch 37 still meets 40, 50, ...
    reached = [i for i in range(37, 60) if unit_reached(Batch(10), i, epoch_len=16)]
    assert reached == [39, 49, 59]


def test_unit_reached_epochs_only_on_last_batch_of_epoch() -> None:
    reached = [i for i in range(0, 64) if unit_reached(Epoch(1), i, epoch_len=16)]
    assert reached == [15, 31, 47, 63]
    reached = [i for i in range(0, 64) if unit_reached(Epoch(2), i, epoch_len=16)]
    assert reached == [31, 63]
    # Unsized loader: epoch_len is sys.maxsize, epochs never end.
    assert not any(unit_reached(Epoch(1), i, epoch_len=sys.maxsize) for i in range(100))


def test_check_boundaries_sets_flags_and_test_mode() -> None:
    bounds = [
        _TrainBoundary(_TrainBoundaryType.TRAIN, Batch(100)),
        _TrainBoundary(_TrainBoundaryType.VALIDATE, Batch(50)),
        _TrainBoundary(_TrainBoundaryType.CHECKPOINT, Epoch(1)),
        _TrainBoundary(_TrainBoundaryType.REPORT, Batch(10)),
    ]
    assert not check_boundaries(bounds, 8, epoch_len=16)
    assert not any(b.limit_reached for b in bounds)
    assert check_boundaries(bounds, 15, epoch_len=16)  # epoch end only
    assert [b.limit_reached for b in bounds] == [False, False, True, False]
    for b in bounds:
        b.limit_reached = False
    assert check_boundaries(bounds, 49, epoch_len=16)
    assert [b.limit_reached for b in bounds] == [False, True, False, True]
    for b in bounds:
        b.limit_reached = False
    assert check_boundaries(bounds, 0, epoch_len=16, test_mode=True)
    assert [b.limit_reached for b in bounds] == [True, False, False, False]


def test_windows_of_the_100_batch_fit() -> None:
    # spec 7: max Batch(100), ckpt/val Batch(50), reporting 100 -> workloads end at 50 and 100.
    bounds = [
        _TrainBoundary(_TrainBoundaryType.TRAIN, Batch(100)),
        _TrainBoundary(_TrainBoundaryType.VALIDATE, Batch(50)),
        _TrainBoundary(_TrainBoundaryType.CHECKPOINT, Batch(50)),
        _TrainBoundary(_TrainBoundaryType.REPORT, Batch(100)),
    ]
    ends = [i + 1 for i in range(100) if check_boundaries(bounds, i, epoch_len=16)]
    assert ends == [50, 100]


def test_callback_counts_of_epoch2_fit() -> None:
    # spec 7 Counter: Epoch(2), ckpt Batch(5), val Batch(10), epoch_len 16 -> 7 workloads.
    def fresh() -> list[_TrainBoundary]:
        return [
            _TrainBoundary(_TrainBoundaryType.TRAIN, Epoch(2)),
            _TrainBoundary(_TrainBoundaryType.VALIDATE, Batch(10)),
            _TrainBoundary(_TrainBoundaryType.CHECKPOINT, Batch(5)),
            _TrainBoundary(_TrainBoundaryType.REPORT, Batch(sys.maxsize)),
        ]

    workloads, validations, checkpoints = 0, 0, 0
    for i in range(32):
        bounds = fresh()
        if check_boundaries(bounds, i, epoch_len=16):
            workloads += 1
            validations += bounds[1].limit_reached
            checkpoints += bounds[2].limit_reached
    assert (workloads, validations, checkpoints) == (7, 3, 6)
    # The loop adds one final validation and checkpoint at the TRAIN boundary (32 is no
    # multiple of 10 or 5): 4 validations, 7 checkpoints, as upstream reports.


def test_remaining_should_stop_progress() -> None:
    assert remaining(Batch(100), 40, 2) == 60
    assert remaining(Epoch(3), 40, 2) == 1
    assert should_stop(Batch(5), 5, 0, 16) and should_stop(Batch(5), 10, 0, 16)
    assert not should_stop(Epoch(2), 31, 1, 16)
    assert [progress(Batch(100), n, 0) for n in range(10, 101, 10)] == pytest.approx(
        [0.1 * k for k in range(1, 11)]
    )
    assert progress(Batch(10), 15, 0) == 1.0  # clamped: report_progress rejects > 1
    assert progress(Epoch(4), 99, 1) == 0.25
    with pytest.raises(TypeError, match="Batch or Epoch"):
        remaining(TrainUnit(3), 1, 1)


def test_epoch_helpers() -> None:
    assert _units.epoch_position(37, 16) == (2, 5)
    assert _units.is_epoch_start(32, 16) and not _units.is_epoch_start(33, 16)
    assert _units.is_epoch_end(47, 16) and not _units.is_epoch_end(46, 16)
    with pytest.raises(ValueError, match="epoch_len"):
        _units.epoch_position(1, 0)
