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
#: Batches before the timed window on every side (one reporting period): the
#: first report's one-time costs (imports of the TensorBoard writer, first
#: allocations) are not per-batch overhead.
WARMUP = 100
# (batch size, features, hidden units). "mlp": a batch of about 1.5 ms on one
# thread; "tiny": about 0.2 ms, where the loop's own overhead dominates.
SIZES = {"mlp": (64, 128, 256), "tiny": (16, 16, 0)}  # tiny: one Linear layer


def _size() -> tuple[int, int, int]:
    return SIZES[os.environ.get("BENCH_PYTORCH_MODEL", "mlp")]


# --- workers (each runs in its own process) ---------------------------------------


def _setup_torch() -> Any:
    import torch

    torch.set_num_threads(1)
    return torch


def _dataset(torch: Any) -> Any:
    batch, features, _ = _size()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch * 100, features, generator=g)  # 100 batches per epoch
    y = torch.randint(0, 10, (batch * 100,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _mlp(torch: Any) -> Any:
    _, features, hidden = _size()
    torch.manual_seed(0)
    nn = torch.nn
    if os.environ.get("BENCH_PYTORCH_MODEL") == "tiny":
        return nn.Linear(features, 10)
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


class _PlainLoop:
    """The hand-written loop: ``loss.item()`` per batch (then the loss is dropped), a
    mean every 100."""

    def __init__(self, torch: Any) -> None:
        import numpy as np

        self._torch, self._mean = torch, np.mean
        self.model = _mlp(torch)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loader = torch.utils.data.DataLoader(_dataset(torch), batch_size=_size()[0])
        self._it = iter(self.loader)
        #: CPU time per batch outside the model's step (fetching the batch, the
        #: loss as a number, the mean), as ``_between`` measures it for a Trainer
        self.between: list[float] = []

    def run(self, batches: int, record: bool = False) -> None:
        cross_entropy = self._torch.nn.functional.cross_entropy
        model, opt = self.model, self.opt
        losses: list[float] = []
        clock = time.process_time
        last = None
        for _ in range(batches):
            try:
                x, y = next(self._it)
            except StopIteration:
                self._it = iter(self.loader)
                x, y = next(self._it)
            now = clock()
            if record and last is not None:
                self.between.append(now - last)
            loss = cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            last = clock()
            losses.append(loss.item())
            # The loss (and with it the autograd graph) is freed here, between two
            # steps, as every Trainer frees it; rebound in the next step it would
            # be freed inside that step's time and charged to the Trainers instead.
            del loss
            if len(losses) == 100:
                _ = float(self._mean(losses))
                losses.clear()


def worker_plain(batches: int) -> dict[str, Any]:
    plain = _PlainLoop(_setup_torch())
    plain.run(WARMUP)
    t0, c0 = time.perf_counter(), time.process_time()
    plain.run(batches - WARMUP)
    return {
        "per_batch_s": (time.perf_counter() - t0) / (batches - WARMUP),
        "cpu_per_batch_s": (time.process_time() - c0) / (batches - WARMUP),
    }


def _trial_class(
    pytorch: Any, torch: Any, marks: dict[str, Any], chunks: dict[str, list[float]]
) -> type:
    """One trial class for ours and Determined's (``pytorch`` is either module)."""

    plain = marks["plain"] = _PlainLoop(torch)

    class Timer(pytorch.PyTorchCallback):
        """At each report (every WARMUP = 100 batches): close the Trainer's chunk,
        run 100 batches of the plain loop (timed apart), reopen the chunk. The
        first chunk of each is the warm-up. Adjacent chunks in one process are
        paired: the machine's drift cancels far better than across processes."""

        def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
            cpu, wall = time.process_time(), time.perf_counter()
            prof = marks.get("profiler")
            if "last_cpu" in marks:
                chunks["cpu"].append(cpu - marks["last_cpu"])
                chunks["wall"].append(wall - marks["last_wall"])
            if prof is not None:
                prof.disable()
            c0 = time.process_time()
            plain.run(WARMUP, record="last_cpu" in marks)
            if "last_cpu" in marks:
                chunks["plain_cpu"].append(time.process_time() - c0)
                marks["plain_in_report"] = time.process_time() - c0
            marks["report"] = True
            if prof is not None:
                prof.enable()
            marks["last_cpu"], marks["last_wall"] = time.process_time(), time.perf_counter()

        def on_validation_start(self) -> None:  # the final validation: training is over
            if "profiler" in marks:
                marks["profiler"].disable()

    class MLPTrial(pytorch.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(_mlp(torch))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))

        def build_callbacks(self) -> dict[str, Any]:
            return {"timer": Timer()}

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(_dataset(torch), batch_size=_size()[0])

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(
                torch.utils.data.Subset(_dataset(torch), range(_size()[0])),
                batch_size=_size()[0],
            )

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            now = time.process_time()
            if "exit" in marks and "last_cpu" in marks:  # past the warm-up
                between = now - marks["exit"]
                if marks.pop("report", False):  # a report (and the plain chunk) in between
                    chunks["report"].append(between - marks.pop("plain_in_report", 0.0))
                else:
                    chunks["between"].append(between)
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            out = {"loss": loss}
            marks["exit"] = time.process_time()
            return out

        def evaluate_batch(self, batch: Any) -> Any:
            x, y = batch
            return {"val_loss": torch.nn.functional.cross_entropy(self.model(x), y)}

    return MLPTrial


def worker_trainer(
    side: str, batches: int, preempt_timing: bool = False, profile: int = 0
) -> dict[str, Any]:
    """One Trainer run; ``profile=N``: cProfile the training loop and return the
    ``N`` functions with the most own time (``tottime``), in µs per batch."""
    torch = _setup_torch()
    if side == "ours":
        sys.path.insert(0, REPO)
        from determined_launch import pytorch
    else:
        from determined import pytorch  # type: ignore[no-redef]
    import logging

    logging.disable(logging.INFO)  # both sides log a line per report; not what we time
    marks: dict[str, Any] = {}
    chunks: dict[str, list[float]] = {
        "cpu": [], "wall": [], "plain_cpu": [], "between": [], "report": []
    }
    calls: dict[str, list[int]] = {"poll": [], "blocking": []}
    with pytorch.init(
        hparams={"global_batch_size": _size()[0] * _world()}, enable_tensorboard_logging=False
    ) as ctx:
        trial = _trial_class(pytorch, torch, marks, chunks)(ctx)
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            marks["profiler"] = prof
        if preempt_timing:
            _time_should_preempt(ctx._core.preempt, calls)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(batches),
            reporting_period=pytorch.Batch(100),  # the default; WARMUP is one period
            checkpoint_policy="none",
        )
        rank = ctx.distributed.rank
    out: dict[str, Any] = {
        "rank": rank,
        "per_batch_s": sum(chunks["wall"]) / (batches - WARMUP),
        "cpu_per_batch_s": sum(chunks["cpu"]) / (batches - WARMUP),
        "plain_cpu_per_batch_s": sum(chunks["plain_cpu"]) / (batches - WARMUP),
        # CPU time per batch between two train_batch calls (the loop's own work and
        # the next batch's fetch), median; plus a report's extra cost spread over
        # its period; and the same for the plain loop run in this process
        "between_us": _between(chunks["between"], chunks["report"]),
        "plain_between_us": _between(marks["plain"].between, []),
        # per pair of adjacent chunks: (Trainer - plain loop) per batch
        "paired_chunk_diffs_us": [
            (t - p) / WARMUP * 1e6 for t, p in zip(chunks["cpu"], chunks["plain_cpu"])
        ],
    }
    if preempt_timing:
        out["poll"] = _stats(calls["poll"])
        out["blocking"] = _stats(calls["blocking"])
    if prof is not None:
        out["profile"] = _top_functions(prof, profile, batches)
    return out


def _top_functions(prof: Any, n: int, batches: int) -> list[dict[str, Any]]:
    """The ``n`` functions with the most own time, and the total of our package's."""
    import pstats

    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    batches -= WARMUP
    rows = []
    ours_us = 0.0
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.items():
        where = f"{os.path.relpath(file, REPO) if file.startswith(REPO) else file}:{line}({name})"
        if "determined_launch" in file:
            ours_us += tottime * 1e6 / batches
        rows.append({
            "function": where,
            "calls_per_batch": calls / batches,
            "own_us_per_batch": tottime * 1e6 / batches,
            "cum_us_per_batch": cumtime * 1e6 / batches,
        })
    rows.sort(key=lambda r: -r["own_us_per_batch"])
    return [{"function": "TOTAL in determined_launch (own time)", "own_us_per_batch": ours_us},
            *rows[:n]]


def _between(ordinary: list[float], reports: list[float]) -> float:
    """Median per-batch CPU time between steps (µs), with the reports' extra
    cost (median report interval minus the ordinary median) spread over the
    WARMUP batches of a reporting period."""
    if not ordinary:
        return float("nan")
    med = statistics.median(ordinary)
    extra = (statistics.median(reports) - med) / WARMUP if reports else 0.0
    return (med + extra) * 1e6


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
