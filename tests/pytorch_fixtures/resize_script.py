"""A Trainer whose final weight depends on where every record lands in the
global sample stream, for resuming on another world size (issue 27 §2).

    python resize_script.py BATCHES   # train to BATCHES, resuming from the newest checkpoint

``y = w * x`` with ``x = 1`` and record ``i``'s target ``0.1 * i``: with MSE and
SGD (lr 0.05) each global batch moves ``w`` to ``0.9 w + 0.1 * mean(targets)``,
so a batch that is skipped, repeated or holds other records moves the final
weight by far more than 3e-4 (the records are shuffled, 32 per epoch, global
batch 8), while the same global batch split over 1 or 2 ranks gives the same
step (DDP averages the ranks' equal-sized means). Run dir and storage come
from DET_RUN_DIR / DET_CHECKPOINT_STORAGE.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch import nn

from determined_launch import pytorch

SEED = 5
HPARAMS = {"global_batch_size": 8}


class Targets(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([1.0]), torch.tensor([0.1 * i])


class StreamTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        model = nn.Linear(1, 1, bias=False)
        model.weight.data.fill_(0.0)
        self.model = context.wrap_model(model)
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(
            Targets(32), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(Targets(1), batch_size=1)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        return {"weight": float(self.model.weight.data.flatten()[0])}


def main(batches: int) -> int:
    with pytorch.init(hparams=dict(HPARAMS), seed=SEED) as ctx:
        trial = StreamTrial(ctx)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(batches), latest_checkpoint="latest",
            checkpoint_policy="none",
        )
        w = float(trial.model.weight.data.flatten()[0])
        print(json.dumps({"rank": ctx.distributed.rank, "size": ctx.distributed.size,
                          "weight": w}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
