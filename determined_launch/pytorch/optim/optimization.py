"""``Optimization``: what ``PyTorchTrialContext`` wraps and steps.

The wrapped models, optimizers, LR schedulers and scaler, and the batch
position within the aggregation window; ``backward`` and ``step_optimizer``
(gradient aggregation, clipping, AMP, Horovod, Apex). The context owns one and
passes its public methods on to it; the loop tells it where each batch is
(``start_batch``) and reads ``communicate`` once per batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from determined_launch import errors
from determined_launch.pytorch.optim import amp as _amp
from determined_launch.pytorch.optim.lr_scheduler import LRScheduler

logger = logging.getLogger("determined_launch.pytorch")

try:  # Apex is deprecated upstream; supported only where it is installed (GPU images).
    import apex
except ImportError:
    apex = None


class _DDP(nn.parallel.DistributedDataParallel):
    """DDP whose unknown attributes fall through to the wrapped module, so user
    code calling ``model.my_method()`` keeps working after ``wrap_model``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":  # not set yet (during __init__/unpickling): no recursion
                raise
            return getattr(self.module, name)


def horovod_requested() -> bool:
    return os.environ.get("USE_HOROVOD", "").strip().lower() in ("1", "true", "yes")


def _torch_distributed_ready() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


class Optimization:
    """Models, optimizers, schedulers and the scaler of one trial, and how a
    batch's gradients become an optimizer step."""

    def __init__(
        self, device: torch.device, distributed: Any, managed_training: bool,
        aggregation_frequency: int,
    ) -> None:
        if not isinstance(aggregation_frequency, int) or aggregation_frequency < 1:
            raise errors.InvalidExperimentException(
                f"aggregation_frequency must be an integer >= 1, got {aggregation_frequency!r}"
            )
        self.device = device
        self.distributed = distributed
        self._managed_training = managed_training
        self._aggregation_frequency = aggregation_frequency
        self.models: list[nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[LRScheduler] = []
        self._main_model = nn.Module()
        self._scaler: Any = None
        self._use_amp = False
        self._use_apex = False
        self._loss_ids: dict[Any, int] = {}
        self._average_aggregated_gradients = True
        self._fp16_compression = False
        self._optimizer_averaging: dict[int, bool] = {}
        self._is_pre_trainer = False
        # DDP-wrapped models (their all-reduce is skipped on accumulating batches)
        self._ddp_models: list[nn.parallel.DistributedDataParallel] = []
        # Horovod: gradients are averaged by hvd.DistributedOptimizer, not DDP.
        self._use_horovod = managed_training and distributed.size > 1 and horovod_requested()
        #: whether this batch ends an aggregation window (None before training)
        self.communicate: Optional[bool] = None

    def start_batch(self, batch_idx: Optional[int]) -> None:
        """The loop is at global batch ``batch_idx`` (None: not training)."""
        if self._loss_ids:  # Apex's loss ids count within one batch
            self._loss_ids = {}
        if batch_idx is None:
            self.communicate = None
        else:
            self.communicate = (
                not self._managed_training or (batch_idx + 1) % self._aggregation_frequency == 0
            )

    # ------------------------------------------------------------------ defaults
    def _set_default_gradient_compression(self, gradient_compression: bool) -> None:
        """Legacy runner: ``optimizations.gradient_compression`` from the config."""
        self._fp16_compression = bool(gradient_compression)

    def _set_default_average_aggregated_gradients(self, average_aggregated_gradients: bool) -> None:
        """Legacy runner: ``optimizations.average_aggregated_gradients``."""
        self._average_aggregated_gradients = bool(average_aggregated_gradients)

    def _set_is_pre_trainer(self) -> None:
        """Legacy runner: the trial came from an experiment config entrypoint."""
        self._is_pre_trainer = True

    # ------------------------------------------------------------------ wrapping
    def wrap_model(self, model: nn.Module, **ddp_kwargs: Any) -> nn.Module:
        """Move ``model`` to the device and, with >1 torch-distributed ranks, wrap it in
        DDP. ``ddp_kwargs`` (e.g. ``find_unused_parameters=True``) go to DDP (FIX-9)."""
        if self._use_apex:
            raise errors.InvalidExperimentException(
                "Please call wrap_model before configure_apex_amp."
            )
        if self._managed_training:
            model = model.to(self.device)
            if self._use_amp:
                model = _amp.autocast_forward(model)
            if self.distributed.size > 1 and _torch_distributed_ready():
                if self.device.type == "cuda":
                    ddp_kwargs.setdefault("device_ids", [self.device])
                    ddp_kwargs.setdefault("output_device", self.device)
                model = _DDP(model, **ddp_kwargs)
            elif ddp_kwargs and self.distributed.size > 1:
                why = "Horovod averages gradients" if self._use_horovod else "no process group"
                logger.warning("wrap_model: DDP arguments ignored (%s)", why)
        setattr(self._main_model, f"model_{len(self.models)}", model)
        self.models.append(model)
        if isinstance(model, nn.parallel.DistributedDataParallel):
            self._ddp_models.append(model)
        return model

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        backward_passes_per_step: int = 1,
        fp16_compression: Optional[bool] = None,
        average_aggregated_gradients: Optional[bool] = None,
    ) -> torch.optim.Optimizer:
        """Register ``optimizer`` for checkpointing and for ``step_optimizer``."""
        if self._use_apex:
            raise errors.InvalidExperimentException(
                "Please call wrap_optimizer before configure_apex_amp."
            )
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise errors.InvalidExperimentException(
                f"wrap_optimizer(backward_passes_per_step={backward_passes_per_step!r}): "
                "must be an integer >= 1"
            )
        if fp16_compression is None:
            fp16_compression = self._fp16_compression
        if average_aggregated_gradients is None:
            average_aggregated_gradients = self._average_aggregated_gradients
        if fp16_compression and not self._managed_training:
            logger.debug("fp16_compression only applies to Horovod training")
        if self._use_horovod:
            import horovod.torch as hvd

            optimizer = hvd.DistributedOptimizer(
                optimizer,
                named_parameters=self._named_parameters_of(optimizer),
                backward_passes_per_step=backward_passes_per_step * self._aggregation_frequency,
                compression=hvd.Compression.fp16 if fp16_compression else hvd.Compression.none,
            )
        self._optimizer_averaging[id(optimizer)] = bool(average_aggregated_gradients)
        self.optimizers.append(optimizer)
        return optimizer

    def _named_parameters_of(self, optimizer: torch.optim.Optimizer) -> list[tuple[str, Any]]:
        """Horovod needs names for the parameters it all-reduces."""
        mine = {id(p) for p in self._parameters(optimizer)}
        return [(n, p) for n, p in self._main_model.named_parameters() if id(p) in mine]

    def wrap_lr_scheduler(
        self,
        lr_scheduler: Any,
        step_mode: LRScheduler.StepMode,
        frequency: int = 1,
    ) -> Any:
        """Register a scheduler to be stepped (``step_mode``) and checkpointed;
        returns the scheduler you passed in."""
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
        if isinstance(lr_scheduler, plateau) and step_mode != LRScheduler.StepMode.MANUAL_STEP:
            raise errors.InvalidExperimentException(
                "detected that context.wrap_lr_scheduler() was called with an instance of "
                "torch.optim.lr_scheduler.ReduceLROnPlateau as the lr_scheduler.  This lr "
                "scheduler class does not have the usual step() parameters, and so it can "
                "only be used with step_mode=MANUAL_STEP."
            )
        opt = getattr(lr_scheduler, "optimizer", None)
        if not any(opt is o for o in self.optimizers):
            raise errors.InvalidExperimentException(
                "the optimizer of this LR scheduler was not returned by "
                "context.wrap_optimizer(); wrap the optimizer first and build the "
                "scheduler on the optimizer that wrap_optimizer returned"
            )
        self.lr_schedulers.append(LRScheduler(lr_scheduler, step_mode, frequency))
        return lr_scheduler

    def wrap_scaler(self, scaler: Any) -> Any:
        """Register a ``GradScaler`` (manual AMP); call it before ``wrap_model``."""
        if self._use_apex:
            raise errors.InvalidExperimentException("Do not mix APEX with PyTorch AMP.")
        if self._scaler is not None:
            raise errors.InvalidExperimentException(
                "Please only call wrap_scaler or use_amp once."
            )
        if self.models:
            raise errors.InvalidExperimentException("Please call wrap_scaler before wrap_model.")
        self._scaler = scaler
        return scaler

    def configure_apex_amp(
        self,
        models: Union[nn.Module, list[nn.Module]],
        optimizers: Union[torch.optim.Optimizer, list[torch.optim.Optimizer]],
        enabled: Optional[bool] = True,
        opt_level: Optional[str] = "O1",
        cast_model_type: Optional[torch.dtype] = None,
        patch_torch_functions: Optional[bool] = None,
        keep_batchnorm_fp32: Optional[Union[bool, str]] = None,
        master_weights: Optional[bool] = None,
        loss_scale: Optional[Union[float, str]] = None,
        cast_model_outputs: Optional[torch.dtype] = None,
        num_losses: Optional[int] = 1,
        verbosity: Optional[int] = 1,
        min_loss_scale: Optional[float] = None,
        max_loss_scale: Optional[float] = 2.0**24,
    ) -> tuple[Any, Any]:
        """Deprecated NVIDIA Apex AMP; GPU only and only where ``apex`` is installed."""
        warnings.warn(
            "configure_apex_amp is deprecated; use experimental.use_amp() or wrap_scaler()",
            FutureWarning,
            stacklevel=2,
        )
        if not self._managed_training or not enabled:
            return models, optimizers
        if not torch.cuda.is_available():
            raise errors.InvalidExperimentException(
                "Mixed precision training (AMP) is supported only on GPU slots."
            )
        if self._scaler is not None:
            raise errors.InvalidExperimentException("Do not mix APEX with PyTorch AMP.")
        if self.distributed.size > 1 and (num_losses != 1 or self._aggregation_frequency > 1):
            raise errors.InvalidExperimentException(
                "Apex AMP with distributed training supports only num_losses=1 and "
                "aggregation_frequency=1."
            )
        if apex is None:
            raise errors.InvalidExperimentException(
                "configure_apex_amp needs NVIDIA apex, which is not installed; "
                "use context.experimental.use_amp() instead"
            )
        self._use_apex = True
        return apex.amp.initialize(
            models,
            optimizers,
            enabled=enabled,
            opt_level=opt_level,
            cast_model_type=cast_model_type,
            patch_torch_functions=patch_torch_functions,
            keep_batchnorm_fp32=keep_batchnorm_fp32,
            master_weights=master_weights,
            loss_scale=loss_scale,
            cast_model_outputs=cast_model_outputs,
            num_losses=num_losses,
            verbosity=verbosity,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
        )

    def autocast_forward_pass(self, to_wrap: nn.Module) -> nn.Module:
        """Run ``to_wrap``'s forward under CUDA autocast (auto-AMP only)."""
        if not self._use_amp:
            return to_wrap
        return _amp.autocast_forward(to_wrap)

    # ------------------------------------------------------------------ stepping
    def _should_communicate_and_update(self) -> bool:
        """True on the last batch of each aggregation window (gradients are
        all-reduced and the optimizer steps only then)."""
        if not self._managed_training:
            return True
        if self.communicate is None:
            raise errors.InternalException("Training hasn't started.")
        return self.communicate

    def backward(
        self,
        loss: torch.Tensor,
        gradient: Optional[torch.Tensor] = None,
        retain_graph: bool = False,
        create_graph: bool = False,
    ) -> None:
        """``loss.backward()``, scaled under auto-AMP and without DDP's all-reduce
        on batches that only accumulate gradients."""
        if self._use_apex:
            opt = self.optimizers
            loss_id = self._loss_ids.setdefault(loss, len(self._loss_ids))
            with apex.amp.scale_loss(loss, opt, loss_id=loss_id) as scaled:
                scaled.backward(gradient=gradient, retain_graph=retain_graph,
                                create_graph=create_graph)
            return
        if self._use_amp:
            loss = self._scaler.scale(loss)
        ddp = self._ddp_models
        if not ddp or not self._managed_training or self._should_communicate_and_update():
            loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)
            return
        with contextlib.ExitStack() as stack:  # accumulate locally: no all-reduce this batch
            for model in ddp:
                stack.enter_context(model.no_sync())
            loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)

    @staticmethod
    def _average_gradients(parameters: Iterator[Any], divisor: int) -> None:
        if divisor == 1:
            return
        for p in parameters:
            if p.grad is not None:
                p.grad.data.div_(divisor)

    @staticmethod
    def _parameters(optimizer: torch.optim.Optimizer) -> list[Any]:
        return [p for group in optimizer.param_groups for p in group.get("params", [])]

    @staticmethod
    def _step(optimizer: torch.optim.Optimizer, scaler: Any) -> None:
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Optional[Callable[[Iterator], None]] = None,
        auto_zero_grads: bool = True,
        scaler: Optional[Any] = None,
    ) -> None:
        """Step ``optimizer`` at the end of each aggregation window: average the
        accumulated gradients, clip (``clip_grads(params)``), step, zero."""
        if self._aggregation_frequency > 1 and not auto_zero_grads:
            raise errors.InvalidExperimentException(
                "if aggregation_frequency > 1, then auto_zero_grads must be True"
            )
        if not self._should_communicate_and_update():
            return
        if self._use_horovod:
            optimizer.synchronize()  # type: ignore[attr-defined]
        agg = self._aggregation_frequency
        if agg > 1 and self._optimizer_averaging.get(
            id(optimizer), self._average_aggregated_gradients
        ):
            self._average_gradients(iter(self._parameters(optimizer)), agg)
        if clip_grads is not None:
            if self._use_amp:
                self._scaler.unscale_(optimizer)
            clip_grads(iter(self._parameters(optimizer)))
        step_scaler = scaler if scaler is not None else (self._scaler if self._use_amp else None)
        if self._use_horovod:  # already synchronized above
            with optimizer.skip_synchronize():  # type: ignore[attr-defined]
                self._step(optimizer, step_scaler)
        else:
            self._step(optimizer, step_scaler)
        if auto_zero_grads:
            optimizer.zero_grad()

