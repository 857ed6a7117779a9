"""Trials for the PyTorch loop tests, written from the spec's section 7 facts.

``OneVarTrial``: one weight ``w`` (``nn.Linear(1, 1, bias=False)``, starting
at 0) fit to ``y = x`` on 64 records ``(1.0, 1.0)`` with SGD lr 0.001 and
MSE, so after ``N`` batches ``w = 1 - 0.998**N`` and the loss of batch ``n``
is ``0.998**(2n)``, whatever the batch size.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn

from determined_launch import pytorch

LR = 0.001
HPARAMS: dict[str, Any] = {
    "hidden_size": 2,
    "learning_rate": 0.5,
    "global_batch_size": 4,
    "lr_scheduler_step_mode": pytorch.LRScheduler.StepMode.MANUAL_STEP.value,
    "dataloader_type": "determined",
    "disable_dataset_reproducibility_checks": False,
}


def expected_weight(n: int) -> float:
    return float(1 - 0.998**n)


def triangle(bs: int, a: int, b: int) -> int:
    """What the batch-index reducers sum over batches a..b-1 of size bs."""
    return sum(bs * i for i in range(a, b))


class PairsDataset(torch.utils.data.Dataset):
    """``n`` records ``(x, y)``; by default all ones. ``distinct=True`` makes
    record i ``(1 + 0.01*i, 1 + 0.01*i)`` so data order changes the weights."""

    def __init__(self, n: int = 64, distinct: bool = False) -> None:
        self.n = n
        self.distinct = distinct

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        v = 1.0 + 0.01 * i if self.distinct else 1.0
        return torch.tensor([v]), torch.tensor([v])


class TriangleLabelSum(pytorch.MetricReducer):
    """Sums ``batch_idx`` once per record of each batch, across ranks."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total = 0

    def update(self, batch_idx: int, records: int) -> None:
        self.total += batch_idx * records

    def per_slot_reduce(self) -> Any:
        return self.total

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        return sum(per_slot_metrics)


class OneVarTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, **options: Any) -> None:
        self.context = context
        self.options = options
        model = nn.Linear(1, 1, bias=False)
        model.weight.data.fill_(0.0)
        self.model = context.wrap_model(model)
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=LR))
        self.loss_fn = nn.MSELoss()
        self.cls_reducer = context.wrap_reducer(TriangleLabelSum(), name="cls_reducer")
        self.fn_reducer = context.wrap_reducer(lambda xs: sum(xs), name="fn_reducer")

    def _weight(self) -> float:
        return float(self.model.weight.data.flatten()[0].item())

    def _data(self, shuffle: bool = False, distinct: bool = False, n: int = 64) -> Any:
        return pytorch.DataLoader(
            PairsDataset(n, distinct), batch_size=self.context.get_per_slot_batch_size(),
            shuffle=shuffle,
        )

    def build_training_data_loader(self) -> Any:
        return self._data(self.options.get("shuffle", False), self.options.get("distinct", False),
                          self.options.get("train_records", 64))

    def build_validation_data_loader(self) -> Any:
        return self._data(distinct=self.options.get("distinct", False),
                          n=self.options.get("val_records", 64))

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        data, label = batch
        w_before = self._weight()
        output = self.model(data)
        loss = self.loss_fn(output, label)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        w_after = self._weight()
        n = self.context.get_per_slot_batch_size()
        self.cls_reducer.update(batch_idx, n)  # type: ignore[attr-defined]
        self.fn_reducer.update(batch_idx * n)  # type: ignore[attr-defined]
        if self.options.get("nan_at") == batch_idx:
            loss = loss * float("nan")
        return {
            "loss": loss,
            "loss_exp": torch.tensor([0.998 ** (2 * batch_idx)]),
            "w_exp": np.array([expected_weight(batch_idx + 1)]),
            "output": output,
            "w_before": w_before,
            "w_after": w_after,
        }

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        data, label = batch
        loss = self.loss_fn(self.model(data), label)
        self.cls_reducer.update(batch_idx, len(data))  # type: ignore[attr-defined]
        self.fn_reducer.update(batch_idx * len(data))  # type: ignore[attr-defined]
        return {"val_loss": loss, "weight": self._weight()}


class OneVarWithScheduler(OneVarTrial):
    """Scheduler whose lr is its step count; the ``lr`` metric is read before
    the loop's automatic step."""

    def __init__(self, context: pytorch.PyTorchTrialContext, step_mode: Any = None,
                 frequency: int = 1, **options: Any) -> None:
        super().__init__(context, **options)
        sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda step: float(step + 1))
        self.sched = context.wrap_lr_scheduler(
            sched, step_mode or pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH, frequency
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        lr = self.sched.get_last_lr()[0]
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        metrics["lr"] = lr
        return metrics


class RNGTrial(OneVarTrial):
    """Validation draws from every RNG the checkpoint restores."""

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        out = super().evaluate_batch(batch, batch_idx)
        out["np"] = float(np.random.randint(0, 1_000_000))
        out["random"] = float(random.randint(0, 1_000_000))
        out["torch"] = float(torch.randint(0, 1_000_000, (1,)).item())
        return out


class Recorder(pytorch.PyTorchCallback):
    """Logs every callback (and, with a trial, train_batch calls) to ``events``."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.calls = 0

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Any) -> None:
        self.events.append(("trial_startup", first_batch_idx, checkpoint_uuid))

    def on_trial_shutdown(self) -> None:
        self.events.append(("trial_shutdown",))

    def on_training_start(self) -> None:
        self.events.append(("training_start",))

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.events.append(("epoch_start", epoch_idx))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.events.append(("epoch_end", epoch_idx))

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        self.events.append(("workload_end", avg_metrics["batches"], len(batch_metrics)))

    def on_validation_start(self) -> None:
        self.events.append(("val_start",))

    def on_validation_epoch_start(self) -> None:
        self.events.append(("val_epoch_start",))

    def on_validation_epoch_end(self, outputs: list[Any]) -> None:
        self.events.append(("val_epoch_end", len(outputs)))

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.events.append(("val_end", sorted(metrics)))

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.events.append(("ckpt_save_start", sorted(checkpoint)))

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self.events.append(("ckpt_write_end",))

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.events.append(("ckpt_upload_end",))

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        self.events.append(("ckpt_load_start",))

    def state_dict(self) -> dict[str, Any]:
        self.calls += 1
        return {"calls": self.calls}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.calls = state_dict["calls"]


class RecordingTrial(OneVarTrial):
    """OneVarTrial that logs its batches and callbacks into ``events``."""

    def __init__(self, context: pytorch.PyTorchTrialContext, events: list[Any],
                 **options: Any) -> None:
        super().__init__(context, **options)
        self.events = events

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        self.events.append(("build_callbacks",))
        return {"recorder": Recorder(self.events)}

    def build_training_data_loader(self) -> Any:
        self.events.append(("build_train_loader",))
        return super().build_training_data_loader()

    def build_validation_data_loader(self) -> Any:
        self.events.append(("build_val_loader",))
        return super().build_validation_data_loader()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.events.append(("train_batch", batch_idx, epoch_idx, self.context.is_epoch_start(),
                            self.context.is_epoch_end()))
        return super().train_batch(batch, epoch_idx, batch_idx)
