"""Seed-002 spellings of the Trainer API (spec 2.12), kept as thin aliases:
functions that ``PyTorchTrialContext`` binds as methods.

``ctx = det.pytorch.init()`` without ``with``, ``ctx.build_trial(Cls)``,
``ctx.train(trial, train_data, val_data, min_validation_period=...,
max_length=...)`` returning the last validation metrics, ``ctx.training.hparams``,
``ctx.config_data`` and ``ctx.distributed.shard_batch_size(n)``.
"""

from __future__ import annotations

import atexit
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from determined_launch.pytorch.api.trial import PyTorchTrial

logger = logging.getLogger("determined_launch.pytorch")


#: Bound by ``api.trainer`` and ``checkpoints.load`` (the package imports
#: both): they sit above the context, which must not import them.
_bound: dict[str, Any] = {}


def bind(*, trainer_class: Any = None, load_trial_from_path: Optional[Callable[..., Any]] = None,
         ) -> None:
    """Called by the modules above the context, when they are imported."""
    if trainer_class is not None:
        _bound["trainer_class"] = trainer_class
    if load_trial_from_path is not None:
        _bound["load_trial_from_path"] = load_trial_from_path


def build_trial(self: Any, trial_cls: type[PyTorchTrial], *args: Any, **kwargs: Any) -> Any:
    """``trial_cls(ctx, *args, **kwargs)``; a class without the
    ``build_*_data_loader`` methods is built too (its data are the loaders
    given to ``train``)."""
    from determined_launch.pytorch.api.trial import buildable_class

    return buildable_class(trial_cls)(self, *args, **kwargs)


def train(
    self: Any,
    trial: PyTorchTrial,
    train_data: Any = None,
    val_data: Any = None,
    *,
    min_validation_period: Any = None,
    min_checkpoint_period: Any = None,
    max_length: Any = None,
    **fit_kwargs: Any,
) -> Optional[dict[str, Any]]:
    """Seed 002's ``context.train``: ``Trainer(trial, ctx).fit(...)`` with
    the given loaders; returns the last validation metrics."""
    if train_data is not None:
        trial.build_training_data_loader = lambda: train_data  # type: ignore[method-assign]
    if val_data is not None:
        trial.build_validation_data_loader = lambda: val_data  # type: ignore[method-assign]
    if min_validation_period is not None:
        fit_kwargs.setdefault("validation_period", min_validation_period)
    if min_checkpoint_period is not None:
        fit_kwargs.setdefault("checkpoint_period", min_checkpoint_period)
    trainer = _bound["trainer_class"](trial, self)
    trainer.fit(max_length=max_length, **fit_kwargs)
    return trainer.last_validation_metrics


def fit(self: Any, trial: PyTorchTrial, *args: Any, **kwargs: Any) -> Optional[dict[str, Any]]:
    """Same as ``train`` (seed 002's checklist spelling)."""
    return train(self, trial, *args, **kwargs)


def load_checkpoint_trial(
    self: Any, trial_cls: type[PyTorchTrial], trial_id: Optional[int] = None,
    storage_id: Optional[str] = None, **trial_kwargs: Any,
) -> Any:
    """Experimental (seed 002): the trial restored from ``storage_id`` in this
    run's checkpoint storage (default: the newest checkpoint of this run).
    ``trial_id`` is accepted for the seed's signature; without a master the
    run directory decides which trial's checkpoints are "latest"."""
    load = _bound.get("load_trial_from_path")
    if load is None:  # bound by checkpoints.load, which the package imports
        raise RuntimeError("determined_launch.pytorch.checkpoints.load is not imported")
    core = self._core
    if trial_id is not None:
        logger.debug("load_checkpoint_trial(trial_id=%s): using this run's storage", trial_id)
    sid = storage_id or core.checkpoint.latest()
    if sid is None:
        raise ValueError(
            "load_checkpoint_trial(): this run has no checkpoint yet; pass storage_id="
        )
    with core.checkpoint.restore_path(sid) as path:
        return load(str(path), trial_class=trial_cls, trial_kwargs=trial_kwargs or None)


def predict(self: Any, trial: PyTorchTrial, data_loader: Any) -> list[Any]:
    """Experimental (seed 002): outputs of ``trial.predict_batch(batch)`` (or of
    ``evaluate_batch`` when the trial has no ``predict_batch``) for every batch,
    in eval mode without gradients, on this rank's device."""
    import torch

    models = list(self.models)
    for model in models:
        model.eval()
    fn = getattr(trial, "predict_batch", None)
    out: list[Any] = []
    try:
        with torch.no_grad():
            for idx, batch in enumerate(data_loader):
                batch = self.to_device(batch)
                out.append(fn(batch) if fn is not None
                           else trial.evaluate_batch(batch=batch, batch_idx=idx))
    finally:
        for model in models:
            model.train()
    return out


class _InitHandle:
    """What ``det.pytorch.init()`` returns: a context manager (``with init() as
    ctx``) that, used without ``with``, enters itself on first attribute access
    and proxies the ``PyTorchTrialContext`` (closed at exit of the process)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._cm: Any = None
        self._ctx: Any = None

    def __enter__(self) -> Any:
        if self._ctx is None:
            self._cm = self._factory()
            self._ctx = self._cm.__enter__()
        return self._ctx

    def __exit__(self, *exc: Any) -> Optional[bool]:
        cm, self._cm, self._ctx = self._cm, None, None
        if cm is None:
            return None
        return cm.__exit__(*exc)

    def close(self) -> None:
        self.__exit__(None, None, None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_factory", "_cm", "_ctx"):
            raise AttributeError(name)
        if self._ctx is None:
            self.__enter__()
            atexit.register(self.close)
            logger.debug("det.pytorch.init() used without `with`; closed at exit")
        return getattr(self._ctx, name)
