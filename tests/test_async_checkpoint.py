"""Asynchronous checkpoints (issue 35 §4): training goes on while a save is
written, the commit marker comes last, one save in flight, errors surface,
preemption and the end of training wait, and a Trainer resumes exactly."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
import torch

from determined_launch import core, pytorch
from determined_launch.core._async_save import CheckpointSaveError
from determined_launch.core._rundir import RunDir
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.storage.directory import DirectoryStorage
from determined_launch.pytorch.checkpoints.snapshot import cpu_copy
from tests._pytorch_helpers import batch_metrics, checkpoints, reports, run_trial
from tests.conftest import base_env
from tests.pytorch_fixtures.onevar import OneVarTrial, expected_weight


def _solo() -> core.DistributedContext:
    return core.DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                                   cross_size=1)


def _ckpt_ctx(tmp_path: pathlib.Path, backend: Any = None) -> CheckpointContext:
    backend = backend or DirectoryStorage(tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    return CheckpointContext(_solo(), backend, RunDir(tmp_path / "run", trial_id=None))


def _blocked_write(gate: threading.Event, started: threading.Event, name: str = "w.bin") -> Any:
    def write(path: pathlib.Path) -> None:
        (path / name).write_bytes(b"x" * 1000)
        started.set()
        assert gate.wait(20), "the test never released the write"
    return write


def test_background_save_overlaps_training_and_commits_last(tmp_path: pathlib.Path) -> None:
    ctx = _ckpt_ctx(tmp_path)
    with ctx.store_path({"steps_completed": 1}) as (path, first):
        (path / "w.bin").write_bytes(b"1")
    gate, started = threading.Event(), threading.Event()
    future = ctx.save_async(_blocked_write(gate, started), {"steps_completed": 2})
    assert started.wait(10)
    steps = 0
    for _ in range(20):  # the loop goes on while the write is blocked
        steps += 1
        time.sleep(0.005)
    assert steps == 20 and not future.done()
    assert ctx.latest() == first and ctx.committed_ids() == [first]  # no marker yet
    gate.set()
    assert future.result(timeout=20) == future.storage_id
    assert ctx.latest() == future.storage_id
    assert ctx.get_metadata(future.storage_id)["steps_completed"] == 2
    assert ctx.wait() == future.storage_id and ctx.wait() is None


def test_one_save_in_flight_and_a_failure_surfaces_once(tmp_path: pathlib.Path) -> None:
    ctx = _ckpt_ctx(tmp_path)
    gate, started = threading.Event(), threading.Event()
    first = ctx.save_async(_blocked_write(gate, started), {"steps_completed": 1})
    assert started.wait(10)
    second: list[Any] = []
    caller = threading.Thread(target=lambda: second.append(
        ctx.save_async(lambda p: (p / "b").write_bytes(b"2"), {"steps_completed": 2})))
    caller.start()
    caller.join(0.5)
    assert caller.is_alive() and not second  # the second save waits for the first
    gate.set()
    caller.join(20)
    assert first.result(timeout=1) and second[0].result(timeout=20)
    assert ctx.latest() == second[0].storage_id

    def broken(path: pathlib.Path) -> None:
        (path / "half").write_bytes(b"h")
        raise OSError("disk full")

    failed = ctx.save_async(broken, {"steps_completed": 3})
    with pytest.raises(CheckpointSaveError) as err:  # at the next save: nothing starts
        ctx.save_async(lambda p: None, {"steps_completed": 4})
    line = str(err.value)
    assert "\n" not in line and failed.storage_id in line and "OSError: disk full" in line
    assert ctx.latest() == second[0].storage_id
    assert ctx.backend.list_ids()[1] == []  # the partial checkpoint is gone
    assert ctx.wait() is None  # raised once, then nothing is in flight


def test_store_path_asynchronous_uploads_in_the_background(tmp_path: pathlib.Path) -> None:
    """The block's files are the copy; the (slow) upload and the commit come after it."""
    gate = threading.Event()

    class SlowStore(DirectoryStorage):  # an upload that takes until the test says
        shared_staging = False

        def begin(self, storage_id: str) -> pathlib.Path:
            (tmp_path / "stage" / storage_id).mkdir(parents=True)
            super().begin(storage_id)
            return tmp_path / "stage" / storage_id

        def put(self, storage_id: str, src: pathlib.Path, files: Any) -> None:
            assert gate.wait(20)
            super().put(storage_id, src, files)

    ctx = _ckpt_ctx(tmp_path, SlowStore(tmp_path / "ckpt"))
    with ctx.store_path({"steps_completed": 5}, asynchronous=True) as (path, sid):
        (path / "model.bin").write_bytes(b"m" * 100)
    assert not ctx.backend.is_committed(sid) and ctx.latest() is None
    gate.set()
    assert ctx.wait() == sid and (tmp_path / "ckpt" / sid / "model.bin").read_bytes() == b"m" * 100
    with pytest.raises(ValueError, match="sharded saves are synchronous"):
        ctx.store_path(shard=True, asynchronous=True)


_KILLED = """
import pathlib, sys, time
from determined_launch import core
ckpt, run = sys.argv[1], sys.argv[2]
with core.init(checkpoint_storage=ckpt, run_dir=run) as ctx:
    if sys.argv[3:] == ["resume"]:  # what a rerun resumes from
        print("RESUME", ctx.checkpoint.latest())
        sys.exit(0)
    with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, sid):
        (path / "w").write_bytes(b"1")
    def write(path):
        (path / "w").write_bytes(b"2" * 4096)
        sys.stdout.write("WRITING\\n"); sys.stdout.flush()
        time.sleep(60)
    ctx.checkpoint.save_async(write, {"steps_completed": 2})
    sys.stdout.write(f"TRAINING {sid}\\n"); sys.stdout.flush()
    time.sleep(60)
"""


def test_killed_mid_save_is_never_committed_and_resume_picks_the_previous(
        tmp_path: pathlib.Path) -> None:
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_KILLED), str(ckpt), str(run)],
                            env=base_env(), stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(2)] if proc.stdout else []
        assert sorted(line.split()[0] for line in lines) == ["TRAINING", "WRITING"], lines
        first = next(line.split()[1] for line in lines if line.startswith("TRAINING"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    storage = DirectoryStorage(ckpt)
    committed, leftovers = storage.list_ids()
    assert committed == [first] and len(leftovers) == 1  # the partial one: not listed
    rerun = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED), str(ckpt), str(run),
                            "resume"], env=base_env(), capture_output=True, text=True, timeout=60)
    assert rerun.stdout.split() == ["RESUME", first], rerun.stderr


def test_cpu_copy_is_independent_of_training() -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    state = cpu_copy({"m": model.state_dict(), "o": opt.state_dict()})
    before = model.weight.detach().clone()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert not torch.equal(model.weight, before)
    assert torch.equal(state["m"]["weight"], before)
    assert hasattr(state["m"], "_metadata")  # load_state_dict's version info survives
    model.load_state_dict(state["m"])
    assert torch.equal(model.weight, before)


class _SlowUpload(pytorch.PyTorchCallback):
    """The first save's write (on the save's thread) lasts until training went
    5 batches past the save."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial
        self.saved_at: list[int] = []
        self.uploaded: list[str] = []

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.saved_at.append(self.trial.batches)

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        if self.trial.options.get("preempt_at") is not None:
            time.sleep(0.5)  # fit() must still return after the commit, not before
            return
        if len(self.saved_at) > 1:
            return
        deadline = time.monotonic() + 10
        while self.trial.batches < self.saved_at[0] + 5 and time.monotonic() < deadline:
            time.sleep(0.002)
        self.trial.overlapped.append(self.trial.batches >= self.saved_at[0] + 5)

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.uploaded.append(uuid)


class _Counting(OneVarTrial):
    def __init__(self, context: Any, **options: Any) -> None:
        super().__init__(context, **options)
        self.batches = 0
        self.overlapped: list[bool] = []
        self.slow = _SlowUpload(self)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.batches += 1
        if batch_idx == self.options.get("preempt_at"):
            self.context._core.preempt.request_preemption("test")
        return super().train_batch(batch, epoch_idx, batch_idx)

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"slow": self.slow}


def test_trainer_async_checkpoints_overlap_and_resume_exactly(tmp_path: pathlib.Path) -> None:
    common: dict[str, Any] = dict(checkpoint_period=pytorch.Batch(10), async_checkpoints=True)
    trial, trainer = run_trial(tmp_path, _Counting, run="a", max_length=pytorch.Batch(30),
                               **common)
    assert trial.overlapped == [True]  # training went on while the first save was held
    saved = checkpoints(tmp_path)
    assert sorted(saved) == [10, 20, 30] and trainer.latest_checkpoint == saved[30].name
    assert trial.slow.uploaded == [saved[n].name for n in (10, 20, 30)]
    # Resume from the step-10 save, written while training moved on: exact.
    again, _ = run_trial(tmp_path, _Counting, run="b", max_length=pytorch.Batch(30),
                         latest_checkpoint=saved[10].name, **common)
    assert float(again.model.weight.data[0, 0]) == float(trial.model.weight.data[0, 0])
    assert float(trial.model.weight.data[0, 0]) == pytest.approx(expected_weight(30), abs=1e-7)
    assert batch_metrics(tmp_path, "b") == batch_metrics(tmp_path, "a")[10:]


def test_trainer_preemption_waits_for_the_save(tmp_path: pathlib.Path) -> None:
    trial, trainer = run_trial(tmp_path, _Counting, max_length=pytorch.Batch(200),
                               trial_kwargs={"preempt_at": 3}, reporting_period=pytorch.Batch(1000),
                               async_checkpoints=True)
    done = len(batch_metrics(tmp_path))
    assert list(checkpoints(tmp_path)) == [done]  # committed before fit() returned
    assert trial.slow.uploaded == [trainer.latest_checkpoint]
    assert reports(tmp_path, "validation") == []
