"""A Trainer script for the real-launcher tests (also run as one plain process).

    python dist_script.py agg       # Identity model, aggregation 2, validate every batch
    python dist_script.py preempt   # slow batches; prints each batch on rank 0
    python dist_script.py per-slot  # launches `agg` with det.launch_per_slot

It never calls torch.distributed itself: det.pytorch.init() must start the
process group under `det-launch torch` (FIX-8). Run dir and storage come from
DET_RUN_DIR / DET_CHECKPOINT_STORAGE.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
from torch import nn

from determined_launch import pytorch


class Records(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([1.0 + 0.1 * i])


class IdentityTrial(pytorch.PyTorchTrial):
    """``y = w * x`` fit to ``y = x``; validation reports ``weight``."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        model = nn.Linear(1, 1, bias=False)
        model.weight.data.fill_(0.0)
        # FIX-9: DDP keyword arguments pass through.
        self.model = context.wrap_model(model, find_unused_parameters=True)
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.001))

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(Records(64), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> Any:
        # One batch in all: with 2 ranks, rank 1's shard is empty (FIX-11).
        n = self.context.get_per_slot_batch_size()
        return pytorch.DataLoader(Records(n), batch_size=n)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        loss = nn.functional.mse_loss(self.model(batch), batch)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"weight": float(self.model.weight.data.flatten()[0])}


class SlowTrial(IdentityTrial):
    """3 training records, global batch 2 on 2 ranks: rank 0's shard has 2
    batches per epoch, rank 1's only 1; both must use the chief's epoch length."""

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(Records(3), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        time.sleep(0.03)
        out = super().train_batch(batch, epoch_idx, batch_idx)
        rank = self.context.distributed.rank
        print(f"rank {rank} finished batch {batch_idx} in epoch {epoch_idx}", flush=True)
        if rank == 0:
            print(f"batch {batch_idx}", flush=True)
        return out

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        rank = self.context.distributed.rank

        class Report(pytorch.PyTorchCallback):
            def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Any) -> None:
                print(f"rank {rank} startup {first_batch_idx}", flush=True)

            def on_trial_shutdown(self) -> None:
                print(f"rank {rank} shutdown", flush=True)

        return {"report": Report()}


def main(mode: str) -> int:
    agg = 2 if mode == "agg" else 1
    gbs = 4 if mode == "agg" else 2
    with pytorch.init(hparams={"global_batch_size": gbs}, aggregation_frequency=agg, seed=3) as ctx:
        if mode == "agg":
            trial: IdentityTrial = IdentityTrial(ctx)
            model = trial.model
            if ctx.distributed.size > 1 and not os.environ.get("USE_HOROVOD"):
                assert isinstance(model, nn.parallel.DistributedDataParallel)
                assert model.find_unused_parameters is True
                assert torch.distributed.get_backend() == "gloo"
            pytorch.Trainer(trial, ctx).fit(
                max_length=pytorch.Batch(16), validation_period=pytorch.Batch(1),
                checkpoint_policy="none",
            )
        else:
            trial = SlowTrial(ctx)
            trainer = pytorch.Trainer(trial, ctx)
            trainer.fit(max_length=pytorch.Batch(60), latest_checkpoint="latest",
                        checkpoint_policy="none")
        w = float(trial.model.weight.data.flatten()[0])
        print(json.dumps({"rank": ctx.distributed.rank, "size": ctx.distributed.size,
                          "weight": w, "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "per-slot":  # our per-slot launcher: no MASTER_ADDR/PORT for torch
        import determined_launch as det

        sys.exit(det.launch_per_slot(lambda rank, local_rank: [sys.executable, __file__, "agg"]))
    sys.exit(main(sys.argv[1]))
