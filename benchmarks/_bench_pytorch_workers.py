"""The measured processes of ``bench_pytorch.py`` (each runs in its own process,
on the project's interpreter or, for Determined, the side venv's)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 64
FEATURES = 128
HIDDEN = 256
RECORDS = 6400  # 100 batches per epoch


# --- workers (each runs in its own process) ---------------------------------------


def _setup_torch() -> Any:
    import torch

    torch.set_num_threads(1)
    return torch


def _dataset(torch: Any) -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(RECORDS, FEATURES, generator=g)
    y = torch.randint(0, 10, (RECORDS,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _mlp(torch: Any) -> Any:
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 10),
    )


def worker_plain(batches: int) -> dict[str, Any]:
    torch = _setup_torch()
    import numpy as np

    model = _mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_dataset(torch), batch_size=BATCH)
    done = 0
    losses: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    while done < batches:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            done += 1
            if done % 100 == 0:
                _ = float(np.mean(losses))
                losses.clear()
            if done == batches:
                break
    return {
        "per_batch_s": (time.perf_counter() - t0) / batches,
        "cpu_per_batch_s": (time.process_time() - c0) / batches,
    }


def _trial_class(pytorch: Any, torch: Any, marks: dict[str, float]) -> type:
    """One trial class for ours and Determined's (``pytorch`` is either module)."""

    class Timer(pytorch.PyTorchCallback):
        def on_training_start(self) -> None:
            marks["start"], marks["cpu_start"] = time.perf_counter(), time.process_time()

        def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
            marks["end"], marks["cpu_end"] = time.perf_counter(), time.process_time()

    class MLPTrial(pytorch.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(_mlp(torch))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))

        def build_callbacks(self) -> dict[str, Any]:
            return {"timer": Timer()}

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(_dataset(torch), batch_size=BATCH)

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(
                torch.utils.data.Subset(_dataset(torch), range(BATCH)), batch_size=BATCH
            )

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> Any:
            x, y = batch
            return {"val_loss": torch.nn.functional.cross_entropy(self.model(x), y)}

    return MLPTrial


def worker_trainer(side: str, batches: int, preempt_timing: bool = False) -> dict[str, Any]:
    torch = _setup_torch()
    if side == "ours":
        sys.path.insert(0, REPO)
        from determined_launch import pytorch
    else:
        from determined import pytorch  # type: ignore[no-redef]
    import logging

    logging.disable(logging.INFO)  # both sides log a line per report; not what we time
    marks: dict[str, float] = {}
    calls: dict[str, list[int]] = {"poll": [], "blocking": []}
    with pytorch.init(
        hparams={"global_batch_size": BATCH * _world()}, enable_tensorboard_logging=False
    ) as ctx:
        trial = _trial_class(pytorch, torch, marks)(ctx)
        if preempt_timing:
            _time_should_preempt(ctx._core.preempt, calls)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(batches),
            reporting_period=pytorch.Batch(100),
            checkpoint_policy="none",
        )
        rank = ctx.distributed.rank
    out: dict[str, Any] = {
        "rank": rank,
        "per_batch_s": (marks["end"] - marks["start"]) / batches,
        "cpu_per_batch_s": (marks["cpu_end"] - marks["cpu_start"]) / batches,
    }
    if preempt_timing:
        out["poll"] = _stats(calls["poll"])
        out["blocking"] = _stats(calls["blocking"])
    return out


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _time_should_preempt(preempt: Any, calls: dict[str, list[int]]) -> None:
    """Shadow the instance's method with a timed one (the loop looks it up per call)."""
    original = preempt.should_preempt
    clock = time.perf_counter_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        result = original(*args, **kwargs)
        blocking = kwargs.get("block", args[0] if args else True)
        calls["blocking" if blocking else "poll"].append(clock() - t0)
        return result

    preempt.should_preempt = timed


def _stats(samples_ns: list[int]) -> dict[str, float]:
    if not samples_ns:
        return {"n": 0}
    s = sorted(samples_ns)
    return {
        "n": len(s),
        "median_us": statistics.median(s) / 1e3,
        "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))] / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
    }


def worker_checkpoint(megabytes: int, reps: int, where: str) -> dict[str, Any]:
    """Plain torch.save/torch.load vs the Trainer's checkpoint and restore, interleaved."""
    torch = _setup_torch()
    sys.path.insert(0, REPO)
    import logging

    from determined_launch import pytorch

    logging.disable(logging.WARNING)
    out_features = megabytes * 2**20 // 4 // 5000
    marks: dict[str, float] = {}

    class Timer(pytorch.PyTorchCallback):
        def on_validation_end(self, metrics: Any) -> None:
            marks["save0"] = time.perf_counter()

        def on_checkpoint_save_start(self, checkpoint: Any) -> None:
            marks.setdefault("write0", time.perf_counter())

        def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
            marks.setdefault("write1", time.perf_counter())

        def on_checkpoint_upload_end(self, uuid: str) -> None:
            marks.setdefault("save1", time.perf_counter())

        def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Any) -> None:
            marks["load0"] = time.perf_counter()

        def on_checkpoint_load_start(self, checkpoint: Any) -> None:
            marks["loaded"] = time.perf_counter()  # torch.load done, state not applied yet

        def on_training_start(self) -> None:
            marks["load1"] = time.perf_counter()

    class Big(pytorch.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(torch.nn.Linear(5000, out_features, bias=False))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.0))

        def build_callbacks(self) -> dict[str, Any]:
            return {"timer": Timer()}

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(
                torch.utils.data.TensorDataset(torch.ones(4, 5000)), batch_size=1
            )

        def build_validation_data_loader(self) -> Any:
            return self.build_training_data_loader()

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            loss = self.model(batch[0]).mean()
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any, batch_idx: int = 0) -> Any:
            return {"v": 0.0}

    results: dict[str, list[float]] = {
        "torch_save": [],
        "torch_load": [],
        "ours_save": [],
        "ours_restore": [],
    }
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        model = torch.nn.Linear(5000, out_features, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        size = sum(p.numel() * p.element_size() for p in model.parameters())

        def plain_save(path: str) -> None:
            os.sync()  # start from clean page cache: no writeback debt from the other side
            t0 = time.perf_counter()
            torch.save(
                {
                    "models_state_dict": [model.state_dict()],
                    "optimizers_state_dict": [opt.state_dict()],
                },
                path,
            )
            results["torch_save"].append(time.perf_counter() - t0)

        def ours_save(run: str) -> str:
            os.sync()
            with pytorch.init(
                hparams={"global_batch_size": 1},
                run_dir=run,
                checkpoint_storage=os.path.join(tmp, "ckpt"),
                enable_tensorboard_logging=False,
            ) as ctx:
                marks.clear()
                pytorch.Trainer(Big(ctx), ctx).fit(
                    max_length=pytorch.Batch(1),
                    validation_period=pytorch.Batch(1),
                    checkpoint_policy="all",
                )
            results["ours_save"].append(marks["save1"] - marks["save0"])
            for phase in ("prepare", "write", "commit"):
                results.setdefault(f"ours_save_{phase}", [])
            results["ours_save_prepare"].append(marks["write0"] - marks["save0"])
            results["ours_save_write"].append(marks["write1"] - marks["write0"])
            results["ours_save_commit"].append(marks["save1"] - marks["write1"])
            with open(os.path.join(run, "latest_checkpoint.json")) as f:
                return os.path.join(tmp, "ckpt", json.load(f)["storage_id"])

        def plain_load(path: str) -> None:
            t0 = time.perf_counter()
            state = torch.load(path)
            model.load_state_dict(state["models_state_dict"][0])
            opt.load_state_dict(state["optimizers_state_dict"][0])
            results["torch_load"].append(time.perf_counter() - t0)

        def ours_restore(run: str, ckpt_dir: str) -> None:
            with pytorch.init(
                hparams={"global_batch_size": 1},
                run_dir=run,
                checkpoint_storage=os.path.join(tmp, "ckpt"),
                enable_tensorboard_logging=False,
            ) as ctx:
                trial = Big(ctx)
                marks.clear()
                pytorch.Trainer(trial, ctx).fit(
                    max_length=pytorch.Batch(1), latest_checkpoint=ckpt_dir
                )
            results["ours_restore"].append(marks["load1"] - marks["load0"])
            results.setdefault("ours_restore_read", []).append(marks["loaded"] - marks["load0"])
            results.setdefault("ours_restore_apply", []).append(marks["load1"] - marks["loaded"])

        for rep in range(reps):  # alternate which side goes first
            path = os.path.join(tmp, f"plain-{rep}.pt")
            run = os.path.join(tmp, f"run-{rep}")
            if rep % 2 == 0:
                plain_save(path)
                ckpt_dir = ours_save(run)
                plain_load(path)
                ours_restore(run, ckpt_dir)
            else:
                ckpt_dir = ours_save(run)
                plain_save(path)
                ours_restore(run, ckpt_dir)
                plain_load(path)
            os.unlink(path)
            shutil.rmtree(ckpt_dir)
    return {
        "state_mb": size / 2**20,
        **{k: statistics.median(v) for k, v in results.items()},
        "all": results,
    }
