"""Where the Trainer's per-batch work goes, in counts that a loaded machine cannot move.

    python benchmarks/bench_pytorch_count.py [--model tiny|mlp] [--batches 300] [--repo DIR]

Issue 28's overhead figures are CPU times, which neighbours on a shared
machine move by more than the 30 µs target. This counts instead, per batch
(after one reporting period of warm-up, reports included, spread over their
100 batches): Python function calls (``sys.setprofile`` "call" events, which
include generator resumptions), C function calls ("c_call") and ATen ops
(a ``TorchDispatchMode``, in a second process: its Python would count as
calls), split into the Trainer's own work between two
model steps (what ``bench_pytorch.py``'s "between steps" figure times) and
the work inside ``train_batch`` (the model step through ``context.backward``
and ``context.step_optimizer``); the plain hand-written loop of
``bench_pytorch.py`` is counted the same way (``loss.item()`` per batch, a
mean every 100). ``--repo`` counts another checkout's Trainer (before/after).
Each count runs in its own process.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class _Counter:
    """Counts calls into one of two buckets, ``inside`` the model step or ``between`` steps."""

    def __init__(self, what: str) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        self.what = what  # "calls" (sys.setprofile) or "ops" (the dispatch mode alone)
        self.inside = False
        self.on = False
        self.counts: dict[str, collections.Counter[str]] = {
            "between": collections.Counter(), "inside": collections.Counter()
        }
        counter = self

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                if counter.on:
                    counter.bucket()["aten"] += 1
                return func(*args, **(kwargs or {}))

        self.ops: Any = Ops() if what == "ops" else contextlib.nullcontext()

    def bucket(self) -> collections.Counter[str]:
        return self.counts["inside" if self.inside else "between"]

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if self.on and event in ("call", "c_call"):
            self.bucket()["py" if event == "call" else "c"] += 1

    def start(self) -> None:
        self.on = True
        if self.what == "calls":
            sys.setprofile(self.profile)

    def stop(self) -> None:
        sys.setprofile(None)
        self.on = False

    def step(self, inside: bool) -> None:
        """Enter (``True``) or leave the model step; the switch itself is not counted."""
        sys.setprofile(None)
        self.inside = inside
        if self.on and self.what == "calls":
            sys.setprofile(self.profile)


def _worker(side: str, batches: int, what: str) -> dict[str, Any]:
    import logging

    import torch

    sys.path.insert(0, HERE)
    import _bench_pytorch_workers as w

    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    c = _Counter(what)
    warm = w.WARMUP
    if side == "plain":
        plain = w._PlainLoop(torch)
        model, opt, ce = plain.model, plain.opt, torch.nn.functional.cross_entropy
        it = iter(plain.loader)
        losses: list[float] = []
        with c.ops:
            for i in range(warm + batches):
                if i == warm:
                    c.start()
                try:
                    x, y = next(it)
                except StopIteration:
                    it = iter(plain.loader)
                    x, y = next(it)
                c.step(True)
                loss = ce(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                c.step(False)
                losses.append(loss.item())
                del loss  # as in bench_pytorch.py's plain loop
                if len(losses) == 100:
                    _ = float(plain._mean(losses))
                    losses.clear()
            c.stop()
    else:
        from determined_launch import pytorch

        class Trial(pytorch.PyTorchTrial):
            def __init__(self, context: Any) -> None:
                self.context = context
                self.model = context.wrap_model(w._mlp(torch))
                self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(),
                                                                  lr=0.01))

            def build_training_data_loader(self) -> Any:
                return pytorch.DataLoader(w._dataset(torch), batch_size=w._size()[0])

            def build_validation_data_loader(self) -> Any:
                return pytorch.DataLoader(
                    torch.utils.data.Subset(w._dataset(torch), range(w._size()[0])),
                    batch_size=w._size()[0],
                )

            def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
                c.step(True)
                if batch_idx == warm:
                    c.start()
                elif batch_idx == warm + batches:
                    c.stop()
                x, y = batch
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
                self.context.backward(loss)
                self.context.step_optimizer(self.opt)
                c.step(False)
                return {"loss": loss}

            def evaluate_batch(self, batch: Any) -> Any:
                x, y = batch
                return {"val_loss": torch.nn.functional.cross_entropy(self.model(x), y)}

        with tempfile.TemporaryDirectory() as tmp:
            os.environ.update(DET_RUN_DIR=os.path.join(tmp, "run"), DET_CHECKPOINT_CODE="0",
                              DET_CHECKPOINT_STORAGE=os.path.join(tmp, "ckpt"))
            with pytorch.init(hparams={"global_batch_size": w._size()[0]},
                              enable_tensorboard_logging=False) as ctx:
                trial = Trial(ctx)
                with c.ops:
                    pytorch.Trainer(trial, ctx).fit(
                        max_length=pytorch.Batch(warm + batches + 1),
                        reporting_period=pytorch.Batch(100), checkpoint_policy="none",
                    )
    return {k: {n: v / batches for n, v in cnt.items()} for k, cnt in c.counts.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny,mlp")
    p.add_argument("--batches", type=int, default=300, help="a multiple of 100 (reports)")
    p.add_argument("--repo", action="append", default=[],
                   help="another checkout's Trainer to count beside this one's (repeatable)")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker[0], int(args.worker[1]), args.worker[2])))
        return
    sides = [("plain", REPO), ("ours", REPO)] + [(f"ours@{r}", r) for r in args.repo]
    for model in args.model.split(","):
        print(f"{model}: per batch, between model steps | inside train_batch "
              "(Python calls, C calls, ATen ops)")
        for name, repo in sides:
            env = {**os.environ, "PYTHONPATH": repo, "BENCH_PYTORCH_MODEL": model,
                   "OMP_NUM_THREADS": "1"}
            res: dict[str, dict[str, float]] = {"between": {}, "inside": {}}
            for what in ("calls", "ops"):
                r = subprocess.run(
                    [sys.executable, os.path.join(HERE, "bench_pytorch_count.py"), "--worker",
                     name.split("@")[0], str(args.batches), what],
                    env=env, capture_output=True, text=True, check=True, timeout=900,
                )
                for bucket, counts in json.loads(r.stdout.strip().splitlines()[-1]).items():
                    res[bucket].update(counts)
            row = " | ".join(
                ", ".join(f"{res[b].get(k, 0):6.1f}" for k in ("py", "c", "aten"))
                for b in ("between", "inside")
            )
            print(f"  {name:12} {row}", flush=True)


if __name__ == "__main__":
    main()
