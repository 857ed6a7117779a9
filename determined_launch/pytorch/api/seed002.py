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
import os
import pathlib
from typing import Any, Callable, Optional

#: a ``PyTorchTrial`` (api/trial.py); not imported, since trial.py imports the context that binds
#: these functions
PyTorchTrial = Any

logger = logging.getLogger("determined_launch.pytorch")

#: the experiment config's variable (det-launch --config); cluster/local_trial.py reads it too
CONFIG_ENV = "DET_LAUNCH_CONFIG"
_CONFIG_MAX_BYTES = 1 << 20


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


def hparams(self: Any) -> Any:
    """``ctx.hparams`` (seed 002, on the trial's context) = ``ctx.get_hparams()``."""
    return self.get_hparams()


def config_data(self: Any) -> dict[str, Any]:
    """``ctx.config_data`` (seed 002): the ``data`` block of the experiment
    config: ``init(exp_conf=)``'s, else that of the file ``DET_LAUNCH_CONFIG``
    names (``det-launch --config EXP.yaml``, ``det job run``); ``{}`` without either."""
    if self._exp_conf is not None:
        return dict(self._exp_conf.get("data") or {})
    path = os.environ.get(CONFIG_ENV, "").strip()
    return config_file_data(path) if path else {}


def config_file_data(path: str) -> dict[str, Any]:
    """The ``data`` block of the config file ``path``; a mistake is one
    ``ValueError`` line naming the file."""
    from determined_launch import values

    where = f"config_data: {path} ({CONFIG_ENV})"
    try:
        with open(path, "rb") as f:
            raw = f.read(_CONFIG_MAX_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{where}: cannot read: {e.strerror or e}") from None
    if len(raw) > _CONFIG_MAX_BYTES:
        raise ValueError(f"{where}: larger than {_CONFIG_MAX_BYTES >> 20} MiB")
    doc = values.yaml_document(raw.decode("utf-8", "replace"), where,
                               "pip install 'determined_launch[torch]'")
    data = doc.get("data") if isinstance(doc, dict) else None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: data: expected a mapping, got {type(data).__name__}")
    return data


def build_trial(self: Any, trial_cls: type[PyTorchTrial], *args: Any, **kwargs: Any) -> Any:
    """``trial_cls(ctx, *args, **kwargs)``; a class without the
    ``build_*_data_loader`` methods is built too (its data are the loaders
    given to ``train``)."""
    from determined_launch.pytorch.api._buildable import buildable_class

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
        trial.build_training_data_loader = lambda: train_data
    if val_data is not None:
        trial.build_validation_data_loader = lambda: val_data
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
    run's checkpoint storage, else from the newest checkpoint of trial
    ``trial_id`` in the experiments root (``det e list-trials``), else from
    this run's newest checkpoint."""
    load = _bound.get("load_trial_from_path")
    if load is None:  # bound by checkpoints.load, which the package imports
        raise RuntimeError("determined_launch.pytorch.checkpoints.load is not imported")
    core = self._core
    kwargs = {"trial_class": trial_cls, "trial_kwargs": trial_kwargs or None}
    if storage_id is None and trial_id is not None and trial_id != self.get_trial_id():
        storage, storage_id = trial_checkpoint(int(trial_id))
        local = pathlib.Path(storage, storage_id)
        if "://" not in storage and (local / "metadata.json").is_file():
            return load(str(local), **kwargs)
        # object storage: the experiment's, which this run's core reads too (DET_CHECKPOINT_STORAGE)
    sid = storage_id or core.checkpoint.latest()
    if sid is None:
        raise ValueError(
            "load_checkpoint_trial(): this run has no checkpoint yet; pass trial_id= or "
            "storage_id="
        )
    with core.checkpoint.restore_path(sid) as path:
        return load(str(path), **kwargs)


def trial_checkpoint(trial_id: int) -> tuple[str, str]:
    """``(storage, storage id)`` of trial ``trial_id``'s newest committed
    checkpoint in the experiments root (``DET_EXPERIMENTS_DIR``, else
    ``./det_experiments``; ``det e list-trials``)."""
    from determined_launch import exproot as root

    where = f"load_checkpoint_trial(trial_id={trial_id})"
    try:
        found = root.trial_checkpoints(trial_id)
    except root.LookupFailed as e:
        raise ValueError(f"{where}: {e}") from None
    if not found:
        raise ValueError(f"{where}: trial {trial_id} has no committed checkpoint in the "
                         f"experiments root {root.root_dir()}")
    return str(found[-1]["storage"]), str(found[-1]["uuid"])


def predict(self: Any, trial: PyTorchTrial, data_loader: Any) -> list[Any]:
    """Experimental (seed 002): outputs of ``trial.predict_batch(batch)`` (or of
    ``evaluate_batch`` when the trial has no ``predict_batch``) for every batch,
    in eval mode without gradients, on this rank's device."""
    import torch

    models = list(self.models)
    for model in models:
        model.eval()
    from determined_launch.pytorch.metrics.utils import _has_batch_idx

    fn = getattr(trial, "predict_batch", None)
    takes_idx = fn is None and _has_batch_idx(trial.evaluate_batch)
    out: list[Any] = []
    try:
        with torch.no_grad():
            for idx, batch in enumerate(data_loader):
                batch = self.to_device(batch)
                if fn is not None:
                    out.append(fn(batch))
                elif takes_idx:
                    out.append(trial.evaluate_batch(batch=batch, batch_idx=idx))
                else:  # seed 002's evaluate_batch(self, batch)
                    out.append(trial.evaluate_batch(batch=batch))
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
