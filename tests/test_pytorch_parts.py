"""The training loop's collaborators, each alone: the boundary arithmetic, the
``Optimization`` (aggregation window, backward/step), the ``BatchStep``, the
``CheckpointPolicy`` and the ``Checkpointer`` (save, then load into a fresh
context). Fast: no Trainer, no launcher."""

from __future__ import annotations

import gc
import pathlib
import sys
from typing import Any, Optional

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from determined_launch import core, errors  # noqa: E402
from determined_launch.pytorch import _units  # noqa: E402
from determined_launch.pytorch._units import (  # noqa: E402
    Batch,
    Epoch,
    _TrainBoundary,
    _TrainBoundaryType,
)
from determined_launch.pytorch.api.context import PyTorchTrialContext  # noqa: E402
from determined_launch.pytorch.api.trial import _TrialState  # noqa: E402
from determined_launch.pytorch.checkpoints.checkpointer import Checkpointer  # noqa: E402
from determined_launch.pytorch.checkpoints.policy import CheckpointPolicy  # noqa: E402
from determined_launch.pytorch.loop.batch_step import BatchStep  # noqa: E402
from determined_launch.pytorch.optim.lr_scheduler import LRScheduler  # noqa: E402
from determined_launch.pytorch.optim.optimization import Optimization  # noqa: E402


def _boundaries(*units: Any) -> list[_TrainBoundary]:
    kinds = [_TrainBoundaryType.TRAIN, _TrainBoundaryType.VALIDATE,
             _TrainBoundaryType.CHECKPOINT, _TrainBoundaryType.REPORT]
    return [_TrainBoundary(kind, unit) for kind, unit in zip(kinds, units)]


@pytest.mark.parametrize("units, epoch_len, test_mode", [
    ((Batch(100), Batch(7), Batch(sys.maxsize), Batch(10)), 16, False),
    ((Epoch(3), Batch(0), Epoch(2), Batch(5)), 4, False),
    ((Batch(50), Batch([3, 9, 20]), Batch(11), Batch(4)), 6, False),
    ((Batch(50), Batch(13), Batch(17), Batch(100)), 5, True),
])
def test_next_boundary_never_skips_a_reached_boundary(
    units: tuple[Any, ...], epoch_len: int, test_mode: bool
) -> None:
    """The loop tests boundaries only at ``next_boundary``: every count where
    ``check_boundaries`` finds one reached must be that count."""
    boundaries = _boundaries(*units)
    count = 0
    stop_at = _units.next_boundary(boundaries, count, epoch_len, test_mode=test_mode)
    for batch_idx in range(60):
        reached = _units.check_boundaries(boundaries, batch_idx, epoch_len, test_mode=test_mode)
        for b in boundaries:
            b.limit_reached = False
        if reached:
            assert batch_idx + 1 == stop_at, (batch_idx, stop_at)
        if batch_idx + 1 >= stop_at:
            stop_at = _units.next_boundary(boundaries, batch_idx + 1, epoch_len,
                                           test_mode=test_mode)
        assert stop_at > batch_idx + 1


def test_next_boundary_skips_to_the_nearest_period() -> None:
    boundaries = _boundaries(Batch(1000), Batch(sys.maxsize), Epoch(1), Batch(100))
    assert _units.next_boundary(boundaries, 0, 64) == 64  # the epoch ends first
    assert _units.next_boundary(boundaries, 64, 64) == 100
    assert _units.next_boundary(boundaries, 100, 1000) == 200


class _Dist:
    size, rank, local_rank = 1, 0, 0


def test_optimization_steps_at_the_end_of_each_aggregation_window() -> None:
    optim = Optimization(torch.device("cpu"), _Dist(), managed_training=True,
                         aggregation_frequency=2)
    with pytest.raises(errors.InternalException):
        optim._should_communicate_and_update()  # before the first batch
    model = optim.wrap_model(torch.nn.Linear(1, 1, bias=False))
    torch.nn.init.zeros_(model.weight)
    opt = optim.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    weights = []
    for batch_idx in range(4):
        optim.start_batch(batch_idx)
        loss = (model(torch.ones(1, 1)) - 1.0).pow(2).sum()  # d/dw = 2(w-1)
        optim.backward(loss)
        optim.step_optimizer(opt)
        weights.append(float(model.weight.detach()))
    # batch 0 accumulates, batch 1 steps with the averaged gradient -2: w = 2
    assert weights[0] == 0.0 and weights[1] == pytest.approx(2.0)
    assert weights[2] == pytest.approx(2.0) and weights[3] == pytest.approx(0.0)
    assert optim.models == [model] and optim.optimizers == [opt]


def test_optimization_rejects_a_bad_aggregation_frequency() -> None:
    with pytest.raises(errors.InvalidExperimentException, match="aggregation_frequency"):
        Optimization(torch.device("cpu"), _Dist(), True, 0)


def _context(core_context: Any, aggregation_frequency: int = 1) -> PyTorchTrialContext:
    return PyTorchTrialContext(
        core_context, trial_seed=1, hparams={"global_batch_size": 2}, slots_per_trial=1,
        num_gpus=0, exp_conf=None, aggregation_frequency=aggregation_frequency,
        steps_completed=0, managed_training=True, debug_enabled=False,
    )


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.calls.append(("start", epoch_idx))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.calls.append(("end", epoch_idx))


def test_batch_step_trains_converts_and_steps_schedulers() -> None:
    with core._dummy_init() as core_context:
        ctx = _context(core_context)
        ctx._epoch_len = 4
        model = ctx.wrap_model(torch.nn.Linear(1, 1, bias=False))
        opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        ctx.wrap_lr_scheduler(sched, step_mode=LRScheduler.StepMode.STEP_EVERY_BATCH)
        seen: list[tuple[int, int]] = []

        class Trial:
            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                seen.append((epoch_idx, batch_idx))
                loss = model(batch).sum()
                ctx.backward(loss)
                ctx.step_optimizer(opt)
                return loss

        recorder = _Recorder()
        step = BatchStep(Trial(), ctx, {"r": recorder})  # type: ignore[dict-item]
        step.epoch_start(1)
        metrics = step(torch.ones(2, 1), epoch_idx=1, batch_idx=5)
        step.epoch_end(1)
        assert seen == [(1, 5)] and ctx.current_train_batch() == 5
        assert set(metrics) == {"loss"} and metrics["loss"].shape == ()  # 0-d ndarray
        assert type(metrics["loss"]).__module__ == "numpy"
        assert sched.get_last_lr() == [pytest.approx(0.05)]  # stepped once
        assert recorder.calls == [("start", 1), ("end", 1)]


def test_batch_step_metrics_are_snapshots_of_the_batch() -> None:
    """A 0-d metric is the batch's value even when the trial updates the tensor
    in place later (a running counter): the old ``numpy(force=True)`` shared
    the CPU tensor's memory, so every batch showed the last value (on a GPU the
    copy to the host hid it). Dtypes and 0-d shapes are kept; bfloat16, which
    numpy lacks, still fails as ``numpy()`` does."""
    with core._dummy_init() as core_context:
        ctx = _context(core_context)
        ctx._epoch_len = 10
        model = ctx.wrap_model(torch.nn.Linear(1, 1, bias=False))
        opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        seen = torch.zeros((), dtype=torch.int64)
        extra: dict[str, Any] = {}

        class Trial:
            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                loss = model(batch).sum()
                ctx.backward(loss)
                ctx.step_optimizer(opt)
                seen.add_(1)
                return {"loss": loss, "seen": seen, "half": loss.detach().half(),
                        "flag": loss > 0, **extra}

        step = BatchStep(Trial(), ctx, {})
        kept = [step(torch.ones(2, 1), epoch_idx=0, batch_idx=i) for i in range(3)]
        assert [int(m["seen"]) for m in kept] == [1, 2, 3]
        m = kept[0]
        assert isinstance(m["loss"], np.ndarray) and m["loss"].shape == ()
        assert m["loss"].dtype == np.float32 and m["seen"].dtype == np.int64
        assert m["half"].dtype == np.float16 and m["flag"].dtype == np.bool_
        extra["bf16"] = torch.ones((), dtype=torch.bfloat16)
        with pytest.raises(TypeError, match="BFloat16"):
            step(torch.ones(2, 1), epoch_idx=0, batch_idx=3)


def test_batch_step_rejects_a_non_dict_result() -> None:
    with core._dummy_init() as core_context:
        ctx = _context(core_context)

        class Trial:
            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                return [1.0]

        with pytest.raises(TypeError, match="must return a torch.Tensor"):
            BatchStep(Trial(), ctx, {})(torch.ones(1), 0, 0)


def _stream(collate_fn: Any = None) -> Any:
    """A repeating det.pytorch.DataLoader of (x, y) pairs, as the Trainer builds it."""
    from determined_launch import pytorch

    data = torch.utils.data.TensorDataset(torch.ones(8, 1), torch.zeros(8, 1))
    kwargs = {} if collate_fn is None else {"collate_fn": collate_fn}
    return pytorch.DataLoader(data, batch_size=2, **kwargs).get_data_loader(repeat=True)


def test_batch_step_run_calls_nothing_of_ours_per_batch() -> None:
    """Issue 28: between two model steps the loop runs no function of this
    package but the preemption poll: no per-batch layers (the old path called
    BatchStep.__call__, start_batch, to_device, _cpu_tensors and two generators
    of ours every batch), and a CPU batch of CPU tensors is not walked."""
    import determined_launch

    root = str(pathlib.Path(determined_launch.__file__).parent)
    ours: list[str] = []
    counting = [False]

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and counting[0] and code.co_filename.startswith(root):
            # the poll's own agreement rounds (core) and its progress beat for the hang
            # watchdog (core/_progress.py, called by should_preempt at its checks) aside
            inside_poll = code.co_filename.endswith(("preempt.py", "_progress.py"))
            if not inside_poll or code.co_name == "should_preempt":
                ours.append(code.co_name)

    with core._dummy_init() as core_context:
        ctx = _context(core_context)
        ctx._epoch_len = 4
        model = ctx.wrap_model(torch.nn.Linear(1, 1, bias=False))
        opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        seen: list[Any] = []

        class Trial:
            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                counting[0] = False
                seen.append(batch)
                loss = model(batch[0]).sum()
                ctx.backward(loss)
                ctx.step_optimizer(opt)
                counting[0] = batch_idx >= 2  # from the end of batch 2's step on
                return {"loss": loss}

        loader = _stream()
        per_batch: list[dict[str, Any]] = []
        step = BatchStep(Trial(), ctx, {})
        preempt = core.PreemptContext(core_context.distributed, max_sync_interval=8)
        # an earlier test's objects collected mid-loop would run their finalizers here
        gc.collect()
        gc.disable()
        sys.setprofile(profile)
        try:
            end, _, polled = step.run(iter(loader), loader, 0, 0, 30, per_batch, preempt)
        finally:
            sys.setprofile(None)
            gc.enable()
        assert (end, polled, len(per_batch)) == (30, False, 30)
        assert set(ours) <= {"should_preempt"}, sorted(set(ours))
        # polled after every batch, but called only where it may check (sync points)
        assert preempt.calls == 30 and 2 <= ours.count("should_preempt") <= 8
        assert all(type(b[0]) is torch.Tensor for b in seen)


def test_batch_step_moves_every_batch_of_a_custom_collate() -> None:
    """Batches are moved unless the loader's collate is torch's default and the
    first batch holds CPU tensors: a collate returning numpy arrays still gives
    ``train_batch`` tensors, every batch."""
    with core._dummy_init() as core_context:
        ctx = _context(core_context)
        ctx._epoch_len = 4
        kinds: list[type] = []

        class Trial:
            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                kinds.append(type(batch[0]))
                return {"loss": torch.zeros(())}

        def numpy_pairs(samples: list[Any]) -> Any:
            return [np.stack([s[0].numpy() for s in samples]),
                    np.stack([s[1].numpy() for s in samples])]

        loader = _stream(numpy_pairs)
        step = BatchStep(Trial(), ctx, {})
        step.run(iter(loader), loader, 0, 0, 5, [], None)
        assert kinds == [torch.Tensor] * 5


def test_batch_step_run_stops_when_the_poll_says_so() -> None:
    with core._dummy_init() as core_context:
        ctx = _context(core_context)
        ctx._epoch_len = 100

        class Trial:
            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                return torch.zeros(())

        class Poll:  # checks on every call, as core's DummyPreemptContext does
            calls = 0

            def quiet_polls(self) -> int:
                return 0

            def skip_polls(self, n: int) -> None:
                assert n == 0

            def should_preempt(self, block: bool) -> bool:
                self.calls += 1
                return self.calls == 3

        loader = _stream()
        per_batch: list[dict[str, Any]] = []
        end, _, polled = BatchStep(Trial(), ctx, {}).run(
            iter(loader), loader, 0, 10, 50, per_batch, Poll(),
        )
        assert (end, polled, len(per_batch)) == (13, True, 3)


@pytest.mark.parametrize("request_at", [0, 5, 13, 40])
def test_batch_step_counted_polls_stop_where_polling_every_batch_does(request_at: int) -> None:
    """The loop counts the polls core says return False instead of making them:
    a preemption requested at any batch stops training after the same batch, with
    the same call count, as ``should_preempt(block=False)`` after every batch (the
    sync schedule is deterministic here: it doubles up to ``max_sync_interval``)."""
    with core._dummy_init() as core_context:
        dist = core_context.distributed
        reference = core.PreemptContext(dist, sync_period=1e9, max_sync_interval=16)
        expected = None
        for batch_idx in range(100):
            if batch_idx == request_at:
                reference.request_preemption()
            if reference.should_preempt(block=False):
                expected = (batch_idx + 1, reference.calls)
                break
        ctx = _context(core_context)
        ctx._epoch_len = 1000
        preempt = core.PreemptContext(dist, sync_period=1e9, max_sync_interval=16)

        class Trial:
            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                if batch_idx == request_at:
                    preempt.request_preemption()
                return torch.zeros(())

        loader = _stream()
        step, batches, end, polled = BatchStep(Trial(), ctx, {}), iter(loader), 0, False
        while not polled:  # segments of 7 batches, as boundaries would cut them
            end, batches, polled = step.run(batches, loader, 0, end, end + 7, [], preempt)
        assert (end, preempt.calls) == expected
        with pytest.raises(ValueError, match="quiet polls"):
            preempt.skip_polls(preempt.quiet_polls() + 1)


def test_metric_keys_must_stay_the_same_within_a_workload() -> None:
    from determined_launch.pytorch.loop.batch_step import check_metric_keys

    check_metric_keys([{"a": 1, "b": 2}, {"b": 3, "a": 4}], 0)
    with pytest.raises(ValueError, match=r"\['a', 'c'\] at batch 12 but \['a', 'b'\]"):
        check_metric_keys([{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1, "c": 2}], 10)


class _Train:
    def __init__(self, best: Optional[float]) -> None:
        self.best = best

    def get_experiment_best_validation(self) -> Optional[float]:
        return self.best


class _Core:
    def __init__(self, best: Optional[float]) -> None:
        self.train = _Train(best)
        self.run_dir = None


@pytest.mark.parametrize("policy, best, metrics, current, expected", [
    ("all", None, {"loss": 1.0}, False, True),
    ("all", None, {"loss": 1.0}, True, False),
    ("none", None, {"loss": 1.0}, False, False),
    ("best", None, {"loss": 1.0}, False, True),     # nothing to beat yet
    ("best", 0.5, {"loss": 1.0}, False, False),     # smaller is better: worse
    ("best", 2.0, {"loss": 1.0}, False, True),      # better
    ("best", 2.0, {"loss": 1.0}, True, False),      # already current
])
def test_checkpoint_policy(policy: str, best: Optional[float], metrics: dict[str, Any],
                           current: bool, expected: bool) -> None:
    p = CheckpointPolicy(policy, "loss", smaller_is_better=True, core_context=_Core(best))
    assert p.wants_checkpoint(metrics, checkpoint_is_current=current) is expected


def test_checkpoint_policy_names_a_missing_searcher_metric() -> None:
    p = CheckpointPolicy("best", "acc", smaller_is_better=False, core_context=_Core(None))
    with pytest.raises(RuntimeError, match="'acc'"):
        p.wants_checkpoint({"loss": 1.0}, checkpoint_is_current=False)


def test_checkpointer_saves_and_loads_into_a_fresh_context(tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DET_CHECKPOINT_CODE", "0")

    class Trial:
        pass

    with core._dummy_init(checkpoint_storage=str(tmp_path / "ckpt")) as core_context:
        ctx = _context(core_context)
        model = ctx.wrap_model(torch.nn.Linear(2, 1))
        ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        state = _TrialState(trial_id=0, batches_trained=7, epochs_trained=1)
        uuid = Checkpointer(Trial(), ctx, core_context, {}, trial_id=0).save(state, False)
        assert state.last_ckpt == 7 and uuid

        fresh = _context(core_context)
        other = fresh.wrap_model(torch.nn.Linear(2, 1))
        fresh.wrap_optimizer(torch.optim.SGD(other.parameters(), lr=0.1))
        fresh._epoch_len = 4
        loader = Checkpointer(Trial(), fresh, core_context, {}, trial_id=0)
        assert loader.resume_offset(uuid, 0) == 7
        with loader.restore_path(uuid) as path:
            restored = loader.load(path)
        assert (restored.batches_trained, restored.epochs_trained, restored.last_ckpt) == (7, 1, 7)
        assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)
        # another trial's checkpoint: weights only, counters from zero (warm start)
        warm = Checkpointer(Trial(), fresh, core_context, {}, trial_id=3)
        assert warm.resume_offset(uuid, 0) == 0
        with warm.restore_path(uuid) as path:
            assert warm.load(path).batches_trained == 0

