"""Reading and writing the files of a PyTorchTrial checkpoint directory.

The directory format is Determined's (spec section 4), so checkpoints move
both ways between ``determined==0.38.1`` and this package::

    state_dict.pth    torch.save of the state dict (models, optimizers, ..., rng_state)
    trial_state.pkl   pickle of a plain dict of counters (batches_trained, ...)
    load_data.json    what load_trial_from_checkpoint_path needs (class, hparams, config)
    code/             a bounded copy of the working directory (see _code_copy.py)

Deviations from upstream, each fixing a verified defect, none breaking
upstream readers:

* FIX-3: ``np_rng_state`` is written as plain Python, so a default
  ``torch.load`` (``weights_only=True`` since torch 2.6) reads our files; we
  read with ``weights_only=True`` plus a small numpy allowlist (enough for
  upstream's files), falling back to a full unpickle only for checkpoints
  from our own storage, and saying so.
* FIX-4: DDP's ``module.`` prefix is stripped on save; loading accepts both.
* FIX-5: ``hparams`` are written even without an experiment config, and a
  trial class defined in ``__main__`` is recorded under an importable name.
* ``trial_state.pkl`` is read through an unpickler that only builds builtin
  scalars and containers, so a crafted file cannot run code.
"""

from __future__ import annotations

import collections
import importlib
import logging
import os
import pathlib
import pickle
import random
from collections.abc import Mapping
from typing import Any, Optional, Union, cast

import numpy as np
import torch

from determined_launch.pytorch.checkpoints.code_copy import CodeCopyStats, copy_code
from determined_launch.pytorch.checkpoints.meta import (
    LEGACY_TRIAL_STATE_FILE,
    LOAD_DATA_FILE,
    METADATA_FILE,
    TRIAL_STATE_FILE,
    TRIAL_STATE_KEYS,
    CheckpointFormatError,
    read_load_data,
    read_metadata,
    read_trial_state,
    trial_cls_spec,
    write_load_data,
    write_trial_state,
)

logger = logging.getLogger("determined_launch.pytorch")

PathLike = Union[str, "os.PathLike[str]"]

#: Where Determined versions put the state dict, newest first (spec 3.10).
#: ``state-dict.pth`` is the spelling in seed 003 and Determined's user guide.
STATE_FILE_CANDIDATES = (
    "state_dict.pth",
    "determined/state_dict.pth",
    "pedl/state_dict.pth",
    "checkpoint.pt",
    "state-dict.pth",
)
STATE_FILE = "state_dict.pth"


__all__ = [
    "CheckpointFormatError",
    "LEGACY_TRIAL_STATE_FILE",
    "LOAD_DATA_FILE",
    "METADATA_FILE",
    "STATE_FILE",
    "STATE_FILE_CANDIDATES",
    "TRIAL_STATE_FILE",
    "TRIAL_STATE_KEYS",
    "CodeCopyStats",
    "copy_code",
    "find_state_file",
    "load_model_state",
    "load_state",
    "model_state_for_save",
    "numpy_safe_globals",
    "read_load_data",
    "read_metadata",
    "read_trial_state",
    "restore_rng_state",
    "rng_state",
    "save_state",
    "trial_cls_spec",
    "write_load_data",
    "write_trial_state",
]


# --- state_dict.pth ----------------------------------------------------------


def find_state_file(path: PathLike) -> pathlib.Path:
    """The state-dict file of the checkpoint directory ``path`` (first that exists
    of ``STATE_FILE_CANDIDATES``); ``CheckpointFormatError`` naming the directory
    otherwise."""
    ckpt_dir = pathlib.Path(path)
    if not ckpt_dir.is_dir():
        raise CheckpointFormatError(
            f"checkpoint directory {ckpt_dir} does not exist or is not a directory; "
            "pass the directory of a checkpoint (the one holding state_dict.pth)"
        )
    for name in STATE_FILE_CANDIDATES:
        candidate = ckpt_dir / name
        if candidate.is_file():
            return candidate
    raise CheckpointFormatError(
        f"{ckpt_dir} is not a PyTorchTrial checkpoint: none of "
        f"{', '.join(STATE_FILE_CANDIDATES)} exists in it"
    )


def numpy_safe_globals() -> list[Any]:
    """The numpy classes and functions a ``weights_only`` load may build.

    Determined's checkpoints hold ``np.random.get_state()`` (an ndarray,
    pickled as ``numpy.core.multiarray._reconstruct`` by numpy 1.x and
    ``numpy._core...`` by 2.x); callbacks' states often hold numpy scalars.
    Only constructors of arrays, dtypes and scalars: nothing that runs code.
    """
    try:  # numpy>=2; numpy 1.x pickles name numpy.core (aliased below)
        core: Any = importlib.import_module("numpy._core.multiarray")
    except ImportError:
        core = importlib.import_module("numpy.core.multiarray")
    out: list[Any] = [
        (core._reconstruct, "numpy.core.multiarray._reconstruct"),
        (core.scalar, "numpy.core.multiarray.scalar"),
        core._reconstruct,
        core.scalar,
        np.ndarray,
        np.dtype,
    ]
    for kind in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
    ):
        out.append(type(np.dtype(kind)))
    return out


def load_state(path: PathLike, trusted: bool, **torch_load_kwargs: Any) -> Any:
    """``torch.load`` a checkpoint's state dict safely (FIX-3).

    ``path`` is a checkpoint directory (its state file is found with
    ``find_state_file``) or the file itself. The load uses
    ``weights_only=True`` with ``numpy_safe_globals()`` allowed. If that
    fails and ``trusted`` is true (the checkpoint is in our own checkpoint
    storage, written by this run's code), it is retried with
    ``weights_only=False`` and a warning; otherwise the error says how to
    opt in. Keyword arguments are passed to ``torch.load`` and win over
    these defaults: an explicit ``weights_only`` disables the fallback.
    Without CUDA, ``map_location`` defaults to ``"cpu"`` so checkpoints
    written on GPUs load.
    """
    p = pathlib.Path(path)
    file = find_state_file(p) if p.is_dir() else p
    if not file.is_file():
        raise CheckpointFormatError(f"checkpoint state file {file} does not exist")
    kwargs = dict(torch_load_kwargs)
    if "map_location" not in kwargs and not torch.cuda.is_available():
        kwargs["map_location"] = "cpu"
    if "weights_only" in kwargs:
        return torch.load(str(file), **kwargs)
    try:
        with torch.serialization.safe_globals(numpy_safe_globals()):
            return torch.load(str(file), weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        if not trusted:
            raise CheckpointFormatError(
                f"{file} holds objects that torch.load(weights_only=True) refuses to "
                f"build ({_first_line(e)}); if you trust this file, pass "
                "torch_load_kwargs={'weights_only': False}"
            ) from e
        logger.warning(
            "%s holds objects outside the weights_only allowlist (%s); loading it with "
            "weights_only=False because it comes from this run's own checkpoint storage",
            file,
            _first_line(e),
        )
        return torch.load(str(file), weights_only=False, **kwargs)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def save_state(ckpt: Mapping[str, Any], path: PathLike) -> pathlib.Path:
    """``torch.save`` the state dict; ``path`` is the checkpoint directory (the
    file is ``state_dict.pth`` in it) or an explicit file path."""
    p = pathlib.Path(path)
    file = p / STATE_FILE if p.is_dir() else p
    torch.save(dict(ckpt), str(file))
    return file


# --- RNG state -----------------------------------------------------------------


def rng_state(local_rank: int = 0) -> dict[str, Any]:
    """Every RNG the loop uses, in Determined's ``rng_state`` layout.

    ``np_rng_state`` is a plain tuple ``("MT19937", [624 ints], pos, has_gauss,
    cached_gaussian)``: ``np.random.set_state`` accepts it and it needs no
    numpy class to unpickle (FIX-3).
    """
    np_state: Any = np.random.get_state(legacy=True)
    kind, key, pos, has_gauss, cached = np_state
    out: dict[str, Any] = {
        "cpu_rng_state": torch.random.get_rng_state(),
        "np_rng_state": (str(kind), key.tolist(), int(pos), int(has_gauss), float(cached)),
        "random_rng_state": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.device_count():
        out["gpu_rng_state"] = torch.cuda.get_rng_state(local_rank)
    return out


def restore_rng_state(state: Optional[Mapping[str, Any]], local_rank: int = 0) -> None:
    """Restore what ``rng_state`` (ours or Determined's) saved, with Determined's
    warnings for a missing state and for GPU state mismatches."""
    if not state:
        logger.warning("The checkpoint has no random state to restore.")
        return
    if "np_rng_state" in state:
        np_state = state["np_rng_state"]
        if isinstance(np_state, (list, tuple)) and len(np_state) >= 2:
            np_state = (np_state[0], np.asarray(np_state[1], dtype=np.uint32), *np_state[2:])
        np.random.set_state(np_state)
    if "random_rng_state" in state:
        random.setstate(_as_random_state(state["random_rng_state"]))
    if "cpu_rng_state" in state:
        torch.random.set_rng_state(state["cpu_rng_state"])
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if has_gpu:
        if "gpu_rng_state" in state:
            torch.cuda.set_rng_state(state["gpu_rng_state"], device=local_rank)
        else:
            logger.warning("The system has a gpu but no gpu_rng_state exists in the checkpoint.")
    elif "gpu_rng_state" in state:
        logger.warning("There exists gpu_rng_state in checkpoint but the system has no gpu.")


def _as_random_state(value: Any) -> Any:
    """``random.setstate`` wants tuples; a state that went through JSON or
    another serializer may come back with lists."""
    if isinstance(value, list) and len(value) == 3:
        version, internal, gauss = value
        return (version, tuple(internal), gauss)
    return value


# --- model state (FIX-4) -------------------------------------------------------


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module under DDP and ``torch.compile`` wrappers."""
    from torch.nn.parallel import DistributedDataParallel

    seen = 0
    while seen < 8:  # bounded: wrappers do not nest deeper in practice
        seen += 1
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = cast(torch.nn.Module, model._orig_mod)
        else:
            break
    return model


def model_state_for_save(model: torch.nn.Module) -> dict[str, Any]:
    """``state_dict()`` of the user's module, without DDP's ``module.`` (or
    ``torch.compile``'s ``_orig_mod.``) prefix, so the keys match the plain model."""
    state: dict[str, Any] = _unwrap(model).state_dict()
    return state


def _strip_prefix(state: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    if not state or not all(isinstance(k, str) and k.startswith(prefix) for k in state):
        return state
    copy: collections.OrderedDict[str, Any] = collections.OrderedDict(state)
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        copy._metadata = collections.OrderedDict(metadata)  # type: ignore[attr-defined]
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(copy, prefix)
    return copy


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any], strict: bool = True) -> Any:
    """Load a saved model state into ``model`` whether either side was
    DDP-wrapped: keys are matched against the unwrapped module, with a
    ``module.``/``_orig_mod.`` prefix removed when every key carries it.
    A genuine mismatch raises ``load_state_dict``'s RuntimeError."""
    for prefix in ("module.", "_orig_mod."):
        state = _strip_prefix(state, prefix)
    return _unwrap(model).load_state_dict(state, strict=strict)
