"""The training loop: callback order, boundaries, LR stepping, and exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from determined_launch import pytorch
from tests._pytorch_helpers import batch_metrics, checkpoints, reports, run_trial
from tests.pytorch_fixtures.onevar import (
    HPARAMS,
    OneVarWithScheduler,
    RecordingTrial,
    RNGTrial,
)

Batch = pytorch.Batch
Mode = pytorch.LRScheduler.StepMode


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _events(root: Path, **fit: Any) -> list[Any]:
    events: list[Any] = []
    run_trial(root, RecordingTrial, trial_kwargs={"events": events, "train_records": 16,
                                                 "val_records": 16}, **fit)
    return events


def test_callback_order_matches_upstream_event_log(tmp_path: Path) -> None:
    ev = _events(tmp_path, max_length=Batch(6), validation_period=Batch(3),
                 checkpoint_period=Batch(2), checkpoint_policy="all")
    ckpt = ["ckpt_save_start", "ckpt_write_end", "ckpt_upload_end"]
    val = ["val_start", "val_epoch_start", "val_epoch_end", "val_end"]
    names = [e[0] for e in ev]
    assert names == [
        "build_callbacks", "trial_startup", "build_train_loader", "build_val_loader",
        "training_start",
        "epoch_start", "train_batch", "train_batch", "workload_end", *ckpt,
        "train_batch", "workload_end", *val, *ckpt,
        "train_batch", "epoch_end", "workload_end", *ckpt,
        "epoch_start", "train_batch", "train_batch", "workload_end", *val, *ckpt,
        "trial_shutdown",
    ]
    assert ev[1] == ("trial_startup", 0, None)
    batches = [e[1:] for e in ev if e[0] == "train_batch"]
    assert batches[0] == (0, 0, True, False) and batches[3] == (3, 0, False, True)
    assert batches[4] == (4, 1, True, False)
    assert [e[1:] for e in ev if e[0] == "workload_end"] == [(2, 2), (3, 1), (4, 1), (6, 2)]
    assert ("val_epoch_end", 4) in ev
    save = next(e for e in ev if e[0] == "ckpt_save_start")[1]
    assert save == ["callbacks", "lr_schedulers_state_dict", "models_state_dict",
                    "optimizers_state_dict", "rng_state"]


@pytest.mark.parametrize(
    "val_period,ckpt_period,expect",
    [(None, None, (1, 1, 1)), (Batch(32), None, (2, 2, 2)), (None, Batch(32), (1, 2, 2))],
)
def test_callback_counts_for_periods(tmp_path: Path, val_period: Any, ckpt_period: Any,
                                     expect: tuple[int, int, int]) -> None:
    hp = dict(HPARAMS, global_batch_size=2)
    events: list[Any] = []
    run_trial(tmp_path, RecordingTrial, hparams=hp, trial_kwargs={"events": events},
              max_length=Batch(64), reporting_period=Batch(10**9),
              validation_period=val_period, checkpoint_period=ckpt_period)
    count = {n: sum(1 for e in events if e[0] == n) for n in
             ("val_end", "ckpt_upload_end", "workload_end", "epoch_start", "epoch_end",
              "trial_startup", "trial_shutdown")}
    assert (count["val_end"], count["ckpt_upload_end"], count["workload_end"]) == expect
    assert count["epoch_start"] == count["epoch_end"] == 2
    assert count["trial_startup"] == count["trial_shutdown"] == 1


def test_progress_reports(tmp_path: Path) -> None:
    run_trial(tmp_path, max_length=Batch(100), reporting_period=Batch(10))
    got = [r["progress"] for r in reports(tmp_path, "progress")]
    assert got == pytest.approx([i / 10 for i in range(1, 11)])


@pytest.mark.parametrize(
    "mode,agg,expect",
    [
        (Mode.STEP_EVERY_BATCH, 1, list(range(1, 41))),
        (Mode.STEP_EVERY_OPTIMIZER_STEP, 1, list(range(1, 41))),
        (Mode.STEP_EVERY_EPOCH, 1, [1] * 16 + [2] * 16 + [3] * 8),
        (Mode.MANUAL_STEP, 1, [1] * 40),
        (Mode.STEP_EVERY_BATCH, 2, [i for k in range(1, 40, 2) for i in (k, k)]),
        (Mode.STEP_EVERY_OPTIMIZER_STEP, 2, [i for k in range(1, 21) for i in (k, k)]),
        (Mode.STEP_EVERY_EPOCH, 2, [1] * 16 + [2] * 16 + [3] * 8),
    ],
)
def test_lr_step_modes(tmp_path: Path, mode: Any, agg: int, expect: list[int]) -> None:
    run_trial(tmp_path, OneVarWithScheduler, trial_kwargs={"step_mode": mode},
              aggregation_frequency=agg, max_length=Batch(40))
    lrs = [round(m["lr"] / 0.001) for m in batch_metrics(tmp_path)]
    assert lrs == expect


def _compare_runs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]), err_msg=k)


@pytest.mark.parametrize(
    "opts,first,total",
    [({}, 100, 200), ({"shuffle": True, "distinct": True}, 30, 60)],
    ids=["scheduler-100+100", "shuffle-mid-epoch-30+30"],
)
def test_checkpoint_restore_equals_uninterrupted(tmp_path: Path, opts: dict[str, Any],
                                                 first: int, total: int) -> None:
    """A(first) + A'(restored, to total) == B(total): batch metrics, validation
    metrics, LR schedule and final weight (FIX-1, FIX-2)."""
    common = dict(trial_kwargs=dict(opts), validation_period=Batch(10),
                  reporting_period=Batch(7))
    ta, _ = run_trial(tmp_path, OneVarWithScheduler, run="a", max_length=Batch(first), **common)
    ckpt = checkpoints(tmp_path)[first]
    ta2, _ = run_trial(tmp_path, OneVarWithScheduler, run="a", max_length=Batch(total),
                       latest_checkpoint=ckpt.name, **common)
    tb, _ = run_trial(tmp_path, OneVarWithScheduler, run="b", max_length=Batch(total), **common)
    _compare_runs(batch_metrics(tmp_path, "a"), batch_metrics(tmp_path, "b"))
    va = [r["metrics"] for r in reports(tmp_path, "validation", "a")]
    vb = [r["metrics"] for r in reports(tmp_path, "validation", "b")]
    assert va == vb and len(va) == total // 10
    assert float(ta2.model.weight.data[0, 0]) == float(tb.model.weight.data[0, 0])
    assert ta2.sched.get_last_lr() == tb.sched.get_last_lr()


def test_shuffle_order_differs_from_unshuffled(tmp_path: Path) -> None:
    """Guard for the test above: shuffling really changes the data order."""
    run_trial(tmp_path, run="s", trial_kwargs={"shuffle": True, "distinct": True},
              max_length=Batch(16))
    run_trial(tmp_path, run="p", trial_kwargs={"distinct": True}, max_length=Batch(16))
    s = [float(m["loss"]) for m in batch_metrics(tmp_path, "s")]
    p = [float(m["loss"]) for m in batch_metrics(tmp_path, "p")]
    assert s != p


def test_rng_state_restored(tmp_path: Path) -> None:
    run_trial(tmp_path, RNGTrial, run="a", max_length=Batch(5), validation_period=Batch(1),
              checkpoint_period=Batch(1), seed=1)
    first = checkpoints(tmp_path)[1]
    run_trial(tmp_path, RNGTrial, run="b", max_length=Batch(5), validation_period=Batch(1),
              checkpoint_period=Batch(1), seed=2, latest_checkpoint=str(first))
    va = [r["metrics"] for r in reports(tmp_path, "validation", "a")]
    vb = [r["metrics"] for r in reports(tmp_path, "validation", "b")]
    assert len(va) == 5 and len(vb) == 4
    assert va[1:] == vb


def test_resume_offset_fix1(tmp_path: Path) -> None:
    """Upstream restarts batch_idx at 0 after a local resume; we continue at 6."""
    run_trial(tmp_path, max_length=Batch(6), trial_kwargs={"train_records": 16})
    ckpt = checkpoints(tmp_path)[6]
    events: list[Any] = []
    trial, _ = run_trial(tmp_path, RecordingTrial, max_length=Batch(10),
                         validation_period=Batch(3), latest_checkpoint=ckpt.name,
                         trial_kwargs={"events": events, "train_records": 16})
    assert events[1] == ("trial_startup", 6, ckpt.name)
    assert [e[1:3] for e in events if e[0] == "train_batch"] == [(6, 1), (7, 1), (8, 2), (9, 2)]
    assert ("epoch_end", 1) in events and ("epoch_start", 2) in events
    assert trial.context.get_initial_batch() == 6
    steps = [r["steps_completed"] for r in reports(tmp_path, "validation")]
    assert steps == [6, 9, 10]


@pytest.mark.parametrize("saved,max_len", [(5, 5), (5, 3)])
def test_max_length_already_reached(tmp_path: Path, saved: int, max_len: int) -> None:
    run_trial(tmp_path, max_length=Batch(saved))
    n_train = len(reports(tmp_path, "training"))
    n_val = len(reports(tmp_path, "validation"))
    run_trial(tmp_path, max_length=Batch(max_len), latest_checkpoint="latest")
    assert len(reports(tmp_path, "training")) == n_train
    assert len(reports(tmp_path, "validation")) == n_val


def test_latest_sentinel_and_directory_fix10(tmp_path: Path) -> None:
    run_trial(tmp_path, max_length=Batch(3), latest_checkpoint="latest")  # nothing yet: fresh
    assert [r["steps_completed"] for r in reports(tmp_path, "training")] == [3]
    run_trial(tmp_path, max_length=Batch(5), latest_checkpoint="latest")
    assert batch_metrics(tmp_path)[3]["w_before"] == pytest.approx(1 - 0.998**3, abs=1e-7)
    path = str(checkpoints(tmp_path)[5])
    run_trial(tmp_path, max_length=Batch(7), latest_checkpoint=path)
    assert len(batch_metrics(tmp_path)) == 7
    with pytest.raises(ValueError, match="neither a checkpoint directory nor a storage id"):
        run_trial(tmp_path, max_length=Batch(9), latest_checkpoint="no-such-checkpoint")


def test_test_mode_trains_one_batch(tmp_path: Path) -> None:
    trial, _ = run_trial(tmp_path, max_length=Batch(100), test_mode=True)
    assert len(batch_metrics(tmp_path)) == 1
    assert len(reports(tmp_path, "validation")) == 1
    assert len(checkpoints(tmp_path)) == 1


def test_test_mode_stays_out_of_the_runs_lineage(tmp_path: Path) -> None:
    # A real run, then --test's fit in the same run directory: the rerun must resume from
    # the real run's batch 3, not from the test's one-batch checkpoint.
    run_trial(tmp_path, max_length=Batch(3))
    pointer = (tmp_path / "run" / "latest_checkpoint.json").read_text()
    run_trial(tmp_path, max_length=Batch(100), test_mode=True)
    assert len(checkpoints(tmp_path)) == 2  # written (test mode checks checkpointing) ...
    assert (tmp_path / "run" / "latest_checkpoint.json").read_text() == pointer  # ... not newest
    run_trial(tmp_path, max_length=Batch(5), latest_checkpoint="latest")
    assert len(batch_metrics(tmp_path)) == 3 + 1 + 2  # batches 4 and 5 (from 1: 4 batches)


def test_step_zero_validation(tmp_path: Path) -> None:
    run_trial(tmp_path, max_length=Batch(2), step_zero_validation=True)
    val = reports(tmp_path, "validation")
    assert [r["steps_completed"] for r in val] == [0, 2]
    assert val[0]["metrics"]["val_loss"] == pytest.approx(1.0)


def test_counter_callback_numbers_with_epoch_length(tmp_path: Path) -> None:
    events: list[Any] = []

    class Legacy(pytorch.PyTorchCallback):
        def on_training_epoch_start(self) -> None:  # type: ignore[override]
            events.append(("legacy_epoch_start",))

    class T(RecordingTrial):
        def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
            out = super().build_callbacks()
            out["legacy"] = Legacy()
            return out

    with pytest.warns(FutureWarning):
        run_trial(tmp_path, T, trial_kwargs={"events": events}, max_length=pytorch.Epoch(2),
                  checkpoint_period=Batch(5), validation_period=Batch(10))
    count = {n: sum(1 for e in events if e[0] == n) for n in {e[0] for e in events}}
    assert count["trial_startup"] == count["trial_shutdown"] == count["training_start"] == 1
    assert count["val_start"] == count["val_end"] == 4
    assert count["ckpt_write_end"] == count["ckpt_upload_end"] == 7
    assert count["epoch_start"] == count["epoch_end"] == 2
    assert count["workload_end"] == 7
    assert count["legacy_epoch_start"] == 2


def test_custom_reducer_windows(tmp_path: Path) -> None:
    from tests.pytorch_fixtures.onevar import triangle

    run_trial(tmp_path, max_length=Batch(30), reporting_period=Batch(10))
    got = [(r["metrics"]["cls_reducer"], r["metrics"]["fn_reducer"])
           for r in reports(tmp_path, "training")]
    assert got == [(180, 180), (580, 580), (980, 980)]
    assert [triangle(4, a, a + 10) for a in (0, 10, 20)] == [180, 580, 980]
    assert reports(tmp_path, "validation")[-1]["metrics"]["cls_reducer"] == 480


def test_tensorboard_under_run_dir_and_optional_fix7(tmp_path: Path) -> None:
    """Upstream writes ./runs in the working directory (then copied into every
    checkpoint) and needs tensorboard installed."""
    trial, _ = run_trial(tmp_path, max_length=Batch(2))
    ctx = trial.context
    assert ctx.get_tensorboard_path() == tmp_path / "run" / "tensorboard"
    writer = ctx.get_tensorboard_writer()
    writer.add_scalar("x", 1.0, 0)  # a real or a no-op writer: never raises
    assert not (tmp_path / "runs").exists()


def _tags(logdir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in logdir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags.update(acc.Tags()["scalars"])
    return tags


@pytest.mark.parametrize("enabled", [True, False])
def test_tensorboard_scalars_written_once_and_off_means_off(tmp_path: Path, enabled: bool
                                                            ) -> None:
    """The Trainer writes Determined/<name> itself; core (MANUAL under the
    Trainer, as upstream) adds no training/<name> copy of every metric, and
    enable_tensorboard_logging=False writes no scalar at all. With object
    storage the event files still reach <storage>/tensorboard/<run>/."""
    pytest.importorskip("tensorboard")
    import fsspec

    from tests.pytorch_fixtures.onevar import HPARAMS, OneVarTrial

    url = f"memory://tbtrainer-{tmp_path.name}-{enabled}/ck"
    with pytorch.init(hparams=dict(HPARAMS), seed=1, run_dir=str(tmp_path / "run"),
                      checkpoint_storage=url, enable_tensorboard_logging=enabled) as ctx:
        pytorch.Trainer(OneVarTrial(ctx), ctx).fit(max_length=Batch(2))
    tags = _tags(tmp_path / "run" / "tensorboard")
    if not enabled:
        assert tags == set()
        return
    assert {"Determined/loss", "Determined/val_loss"} <= tags
    assert all(tag.startswith("Determined/") for tag in tags), tags
    (local,) = (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*")
    memory = fsspec.filesystem("memory")
    (remote,) = memory.find(f"/tbtrainer-{tmp_path.name}-{enabled}/ck/tensorboard/run")
    assert memory.cat_file(remote) == local.read_bytes()  # the final sync has the last report


@pytest.mark.parametrize("smaller", ["true", "false"])
def test_best_policy_ranks_by_the_metric_det_launch_hands_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smaller: str) -> None:
    """Under det-launch experiment or --config the searcher metric arrives as
    DET_SEARCHER_METRIC / DET_SMALLER_IS_BETTER, not as init(exp_conf=...):
    checkpoint_policy="best" ranks by it (it used to checkpoint every
    validation). The weight grows from 0 towards 1: smaller-is-better keeps
    only the first validation's checkpoint, larger-is-better every one."""
    monkeypatch.setenv("DET_SEARCHER_METRIC", "weight")
    monkeypatch.setenv("DET_SMALLER_IS_BETTER", smaller)
    run_trial(tmp_path, max_length=Batch(4), validation_period=Batch(1),
              checkpoint_policy="best")
    saved = sorted(checkpoints(tmp_path))
    assert saved == ([1, 4] if smaller == "true" else [1, 2, 3, 4])  # 4: the end of training


def test_schedules_and_epoch_periods(tmp_path: Path) -> None:
    """Container periods are explicit schedules; Epoch periods land on epoch ends."""
    run_trial(tmp_path, run="list", max_length=Batch(10), validation_period=Batch([3, 7]),
              checkpoint_period=Batch(10**9), checkpoint_policy="none")
    assert [r["steps_completed"] for r in reports(tmp_path, "validation", "list")] == [3, 7, 10]
    run_trial(tmp_path, run="ep", trial_kwargs={"train_records": 16}, max_length=Batch(10),
              validation_period=pytorch.Epoch(1), checkpoint_policy="none")
    assert [r["steps_completed"] for r in reports(tmp_path, "validation", "ep")] == [4, 8, 10]
    assert [r["metrics"]["epochs"] for r in reports(tmp_path, "validation", "ep")] == [1, 2, 2]


def test_evaluate_batch_without_batch_idx_and_full_dataset(tmp_path: Path) -> None:
    from tests.pytorch_fixtures.onevar import OneVarTrial

    class OldStyle(OneVarTrial):
        def evaluate_batch(self, batch: Any) -> dict[str, Any]:  # type: ignore[override]
            data, label = batch
            return {"val_loss": self.loss_fn(self.model(data), label)}

    class Full(OneVarTrial):
        evaluate_batch = pytorch.PyTorchTrial.evaluate_batch  # type: ignore[assignment]

        def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
            n = sum(len(b[0]) for b in data_loader)
            return {"records": n, "weight": self._weight()}

    run_trial(tmp_path, OldStyle, run="old", max_length=Batch(2))
    run_trial(tmp_path, Full, run="full", max_length=Batch(2))
    old = reports(tmp_path, "validation", "old")[-1]["metrics"]
    full = reports(tmp_path, "validation", "full")[-1]["metrics"]
    assert old["val_loss"] == pytest.approx(0.998**4, abs=1e-6)
    assert full["records"] == 64 and full["weight"] == pytest.approx(1 - 0.998**2, abs=1e-7)


def test_crash_then_rerun_resumes_from_last_checkpoint(tmp_path: Path) -> None:
    """Upstream's failable fixture: fail at batch 7, rerun continues at batch 6."""
    from tests.pytorch_fixtures.onevar import OneVarTrial

    class Failable(OneVarTrial):
        fail_at: Any = 7

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            if batch_idx == self.fail_at:
                raise RuntimeError("failing on purpose")
            return super().train_batch(batch, epoch_idx, batch_idx)

    with pytest.raises(RuntimeError, match="on purpose"):
        run_trial(tmp_path, Failable, max_length=Batch(10), checkpoint_period=Batch(3))
    assert list(checkpoints(tmp_path)) == [3, 6]
    Failable.fail_at = None
    events: list[Any] = []

    class Rerun(Failable):
        def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
            from tests.pytorch_fixtures.onevar import Recorder

            return {"r": Recorder(events)}

    trial, _ = run_trial(tmp_path, Rerun, max_length=Batch(10), checkpoint_period=Batch(3),
                         latest_checkpoint="latest")
    assert events[0][:2] == ("trial_startup", 6)
    from tests.pytorch_fixtures.onevar import expected_weight

    assert float(trial.model.weight.data[0, 0]) == pytest.approx(expected_weight(10), abs=1e-7)
