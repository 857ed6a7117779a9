"""Rebuild a trained ``PyTorchTrial`` from a checkpoint directory (spec 2.10).

``load_trial_from_checkpoint_path(path)`` reads ``load_data.json`` (or the
``metadata.json`` of Determined <= 0.17.7 checkpoints), imports the trial
class from the checkpoint's ``code/`` copy, instantiates it with a
``CheckpointLoadContext`` (no training, no process group, no device moves)
and loads the saved model weights. Checkpoints written by Determined load
here, and ours load in Determined.

Differences from Determined 0.38.1, each fixing a verified defect:
``torch.load`` runs with ``weights_only=True`` and a numpy allowlist, so
Determined's checkpoints load on torch >= 2.6 (FIX-3); DDP-saved weights
load into the plain model (FIX-4); a checkpoint written without an
experiment config still has its hparams (FIX-5); ``trial_class`` is honoured
for legacy-entrypoint checkpoints too.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pathlib
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import torch

from determined_launch.pytorch.api import seed002
from determined_launch.pytorch.api.context import PyTorchTrialContext
from determined_launch.pytorch.api.trial import buildable_class
from determined_launch.pytorch.checkpoints import files as cio

logger = logging.getLogger("determined_launch.pytorch")


class _LoadCore:
    """The Core API stand-in of a context that never trains: one process,
    nothing reported, nothing written."""

    def __init__(self) -> None:
        from determined_launch.core import DistributedContext

        self.distributed = DistributedContext(
            rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
        )
        self.info = None
        self.train = None
        self.checkpoint = None
        self.preempt = None
        self.searcher = None


def _num_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class CheckpointLoadContext(PyTorchTrialContext):
    """A ``PyTorchTrialContext`` for building a trial outside training, e.g.
    to load a checkpoint's weights into ``MyTrial(context, extra_arg)``::

        with det.import_from_path(ckpt_dir + "/code"):
            import model_def
        trial = model_def.MyTrial(pytorch.CheckpointLoadContext(hparams))

    One process (no DDP), trial seed 0, aggregation 1, and models stay on the
    CPU where they were built (unmanaged: ``wrap_model`` does not move them).
    """

    def __init__(
        self, hparams: Optional[dict] = None, exp_conf: Optional[dict[str, Any]] = None
    ) -> None:
        super().__init__(
            core_context=_LoadCore(),
            trial_seed=0,
            hparams=hparams,
            slots_per_trial=1,
            num_gpus=_num_gpus(),
            exp_conf=exp_conf,
            aggregation_frequency=1,
            steps_completed=0,
            managed_training=False,
            debug_enabled=False,
        )


def _legacy_context(config: Mapping[str, Any], hparams: Optional[dict]) -> PyTorchTrialContext:
    """The context Determined's legacy-entrypoint shim builds from the experiment config."""
    opt = config.get("optimizations") or {}
    resources = config.get("resources") or {}
    repro = config.get("reproducibility") or {}
    context = PyTorchTrialContext(
        core_context=_LoadCore(),
        trial_seed=int(repro.get("experiment_seed") or 0),
        hparams=hparams,
        slots_per_trial=int(resources.get("slots_per_trial") or 1),
        num_gpus=_num_gpus(),
        exp_conf=dict(config),
        aggregation_frequency=int(opt.get("aggregation_frequency") or 1),
        steps_completed=0,
        managed_training=False,
        debug_enabled=False,
    )
    context._set_default_gradient_compression(bool(opt.get("gradient_compression", False)))
    context._set_default_average_aggregated_gradients(
        bool(opt.get("average_aggregated_gradients", True))
    )
    return context


@contextlib.contextmanager
def _in_code_dir(code_dir: pathlib.Path, module_name: str) -> Iterator[None]:
    """Import from ``code/`` with it as the working directory (model definitions
    of that era read files such as const.yaml relative to it), as Determined does.

    An already imported module of the same top-level name that does not come
    from ``code/`` (the usual ``model_def`` of another experiment, or of the
    working directory) is set aside for the import and put back afterwards,
    so the checkpoint's own code is what gets imported.
    """
    from determined_launch._user import import_from_path

    top = module_name.split(".")[0]
    stashed = {
        name: mod
        for name, mod in sys.modules.items()
        if (name == top or name.startswith(top + ".")) and not _comes_from(mod, code_dir)
    }
    for name in stashed:
        del sys.modules[name]
    old = os.getcwd()
    try:
        with import_from_path(code_dir):
            if code_dir.is_dir():
                os.chdir(code_dir)
            try:
                yield
            finally:
                os.chdir(old)
    finally:
        sys.modules.update(stashed)


def _comes_from(module: Any, directory: pathlib.Path) -> bool:
    file = getattr(module, "__file__", None)
    if not file:
        return False
    try:
        pathlib.Path(file).resolve().relative_to(directory.resolve())
    except (ValueError, OSError):
        return False
    return True


def _import_spec(spec: str) -> Any:
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _torch_load_kwargs(
    torch_load_kwargs: Optional[dict[str, Any]], kwargs: dict[str, Any]
) -> dict[str, Any]:
    out = dict(torch_load_kwargs or {})
    if kwargs:
        if out:
            raise ValueError("kwargs may not be set if torch_load_kwargs is also set")
        warnings.warn(
            "Passing **kwargs to load_trial_from_checkpoint_path() is deprecated; pass a dict "
            "as torch_load_kwargs= instead.",
            FutureWarning,
            stacklevel=3,
        )
        out = dict(kwargs)
    return out


def load_trial_from_checkpoint_path(
    path: str,
    trial_class: Optional[type] = None,
    trial_kwargs: Optional[dict[str, Any]] = None,
    torch_load_kwargs: Optional[dict[str, Any]] = None,
    **kwargs: Any,
) -> Any:
    """Load a checkpoint written by a PyTorchTrial (ours or Determined's).

    Returns the restored instance of the trial class (for checkpoints of the
    pre-0.12.13 ``build_model()`` API, the bare ``nn.Module``, as Determined).

    Arguments:
        path: the checkpoint directory (the one holding ``state_dict.pth``).
        trial_class: your PyTorchTrial subclass, if importing it from the
            checkpoint's ``code/`` directory does not work.
        trial_kwargs: extra keyword arguments for the trial's ``__init__``.
        torch_load_kwargs: keyword arguments for ``torch.load``; they win over
            the safe defaults (``weights_only=True`` with a numpy allowlist).
        **kwargs: deprecated spelling of ``torch_load_kwargs``.
    """
    load_kwargs = _torch_load_kwargs(torch_load_kwargs, kwargs)
    ckpt_dir = pathlib.Path(path)
    state_file = cio.find_state_file(ckpt_dir)
    data = cio.read_load_data(ckpt_dir)
    spec: str = data["trial_cls_spec"]
    hparams = data["hparams"]
    config = data["experiment_config"]

    if data["trial_in_main"] and trial_class is None:
        module, _, qualname = spec.partition(":")
        if not module:
            raise ValueError(
                f"Unable to load trial class {qualname}, which was defined in the entrypoint "
                "script, but the entrypoint script did not appear to be an importable module. "
                "Define your Trial class in an importable module, or pass trial_class=."
            )
        logger.warning(
            "Importing trial class %s, which was defined in the entrypoint script, as "
            "`import %s` from the checkpoint's code/ directory",
            qualname,
            module,
        )

    if trial_class is None:
        try:
            with _in_code_dir(ckpt_dir / "code", spec.partition(":")[0]):
                trial_class = _import_spec(spec)
        except Exception as e:
            raise ValueError(
                f"Automatic import logic failed to import Trial class as {spec} from "
                f"{ckpt_dir / 'code'} ({type(e).__name__}: {e}). You will need to provide "
                "your Trial class via the trial_class argument instead."
            ) from e

    if data["is_trainer"]:
        context: PyTorchTrialContext = CheckpointLoadContext(hparams, config)
    else:
        if config is None or hparams is None:
            raise cio.CheckpointFormatError(
                f"{ckpt_dir}: a legacy-entrypoint checkpoint must record its experiment config "
                "and hparams in load_data.json"
            )
        context = _legacy_context(config, hparams)

    # a seed-002 trial (no build_*_data_loader) loads too: loading needs no data
    trial = buildable_class(trial_class)(context, **(trial_kwargs or {}))
    checkpoint = cio.load_state(state_file, trusted=False, **load_kwargs)
    if not isinstance(checkpoint, Mapping):
        raise cio.CheckpointFormatError(f"{state_file} does not hold a state dict")

    if data["legacy_metadata"]:
        model = _load_build_model(trial, checkpoint, state_file)
        if model is not None:
            return model
    return _load_models(trial, context, checkpoint, state_file)


def _load_build_model(
    trial: Any, checkpoint: Mapping[str, Any], state_file: pathlib.Path
) -> Optional[torch.nn.Module]:
    """Checkpoints of the pre-0.12.13 API: the trial's ``build_model()`` made
    the model, and Determined returned the bare module."""
    build_model = getattr(trial, "build_model", None)
    if "model_state_dict" in checkpoint:
        if not callable(build_model):
            raise cio.CheckpointFormatError(
                f"{state_file} holds a single 'model_state_dict' (the pre-0.12.13 API) but "
                f"{type(trial).__name__} has no build_model()"
            )
        model = build_model()
        cio.load_model_state(model, checkpoint["model_state_dict"])
        return model
    if callable(build_model):
        model = build_model()
        cio.load_model_state(model, checkpoint["models_state_dict"][0])
        return model
    return None


def _load_models(
    trial: Any,
    context: PyTorchTrialContext,
    checkpoint: Mapping[str, Any],
    state_file: pathlib.Path,
) -> Any:
    states = checkpoint.get("models_state_dict")
    if states is None and "model_state_dict" in checkpoint:
        states = [checkpoint["model_state_dict"]]
    if not isinstance(states, (list, tuple)):
        raise cio.CheckpointFormatError(f"{state_file} has no models_state_dict list")
    if len(states) < len(context.models):
        raise cio.CheckpointFormatError(
            f"{state_file} holds {len(states)} model state(s) but {type(trial).__name__} "
            f"wrapped {len(context.models)} model(s); is this the trial class that wrote it?"
        )
    for model, state in zip(context.models, states):
        cio.load_model_state(model, state)
    return trial


# ``ctx.load_checkpoint_trial(...)`` (seed 002); bound here, above the context.
seed002.bind(load_trial_from_path=load_trial_from_checkpoint_path)
