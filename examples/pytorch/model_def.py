"""An MNIST-style PyTorchTrial (Determined's mnist_pytorch tutorial shape) on
synthetic digits. The only change from Determined code is the import line.

Run it either way (see docs/pytorch.md):
    python train.py --batches 200                       # Trainer API script (see train.py)
    python -m determined_launch.pytorch --config const.yaml model_def:MNistTrial   # legacy
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch
from data import SyntheticDigits
from torch import nn

from determined_launch import pytorch  # was: from determined import pytorch


class Flatten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1)


class MNistTrial(pytorch.PyTorchTrial):
    def __init__(
        self, context: pytorch.PyTorchTrialContext, hparams: Optional[Mapping[str, Any]] = None
    ) -> None:
        self.context = context
        # train.py passes the trial's hparams, as Determined's Trainer example
        # does; the legacy runner constructs MNistTrial(context) only.
        hp = (hparams if hparams is not None else context.get_hparams()).__getitem__
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Conv2d(1, hp("n_filters1"), 3, 1),
                nn.ReLU(),
                nn.Conv2d(hp("n_filters1"), hp("n_filters2"), 3, 1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Dropout2d(hp("dropout1")),
                Flatten(),
                nn.Linear(144 * hp("n_filters2"), 64),
                nn.ReLU(),
                nn.Dropout(hp("dropout2")),
                nn.Linear(64, 10),
                nn.LogSoftmax(dim=1),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adadelta(self.model.parameters(), lr=hp("learning_rate"))
        )
        data = context.get_data_config()  # exp_conf["data"], may be empty
        self.train_size = int(data.get("train_size", 6000))
        self.val_size = int(data.get("val_size", 1000))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            SyntheticDigits(self.train_size, seed=1),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            SyntheticDigits(self.val_size, seed=2),
            batch_size=self.context.get_per_slot_batch_size(),
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        data, labels = batch
        output = self.model(data)
        loss = nn.functional.nll_loss(output, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        data, labels = batch
        output = self.model(data)
        validation_loss = nn.functional.nll_loss(output, labels).item()
        accuracy = output.argmax(dim=1).eq(labels).float().mean().item()
        return {"validation_loss": validation_loss, "accuracy": accuracy}
