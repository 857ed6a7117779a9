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
import io
import json
import logging
import os
import pathlib
import pickle
import random
import sys
from collections.abc import Mapping
from typing import Any, Optional, Union, cast

import numpy as np
import torch

from determined_launch.errors import InvalidCheckpointException
from determined_launch.pytorch._code_copy import CodeCopyStats, copy_code

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
TRIAL_STATE_FILE = "trial_state.pkl"
LEGACY_TRIAL_STATE_FILE = "workload_sequencer.pkl"
LOAD_DATA_FILE = "load_data.json"
METADATA_FILE = "metadata.json"

TRIAL_STATE_KEYS = (
    "trial_id",
    "last_ckpt",
    "step_id",
    "last_val",
    "batches_trained",
    "epochs_trained",
)

__all__ = [
    "CheckpointFormatError",
    "CodeCopyStats",
    "copy_code",
    "find_state_file",
    "load_model_state",
    "load_state",
    "model_state_for_save",
    "numpy_safe_globals",
    "read_load_data",
    "read_trial_state",
    "restore_rng_state",
    "rng_state",
    "save_state",
    "write_load_data",
    "write_trial_state",
]


class CheckpointFormatError(InvalidCheckpointException, AssertionError):
    """A directory is not a readable PyTorchTrial checkpoint.

    Also an ``AssertionError``: Determined raises that for a checkpoint
    without ``load_data.json``/``metadata.json``, and callers may catch it.
    """


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


# --- trial_state.pkl -------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle encodes natively (None, bool, int, float, str,
    bytes, list, tuple, dict, set): every class lookup is refused, so a crafted
    file cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name}: trial state files hold plain data only"
        )


def _read_plain_pickle(file: pathlib.Path) -> Any:
    try:
        return _PlainUnpickler(io.BytesIO(file.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise CheckpointFormatError(f"{file} is not a valid trial state file: {e}") from e


def write_trial_state(path: PathLike, state: Mapping[str, Any]) -> pathlib.Path:
    """Write ``trial_state.pkl``: a pickle of a plain dict, as Determined writes
    it (``pickle.dump(vars(state))``), so upstream can resume from it."""
    plain = {k: _plain_int(state, k) for k in TRIAL_STATE_KEYS if k in state}
    file = pathlib.Path(path) / TRIAL_STATE_FILE
    with open(file, "wb") as f:
        pickle.dump(plain, f, protocol=4)
    return file


def _plain_int(state: Mapping[str, Any], key: str) -> Optional[int]:
    value = state[key]
    return None if value is None else int(value)


def read_trial_state(path: PathLike, epoch_len: Optional[int] = None) -> Optional[dict[str, Any]]:
    """The counters saved with a checkpoint, as a dict with ``TRIAL_STATE_KEYS``.

    Reads ``trial_state.pkl``, else the legacy ``workload_sequencer.pkl``
    (Determined <= 0.20: ``steps_completed`` or ``latest_batch`` becomes
    ``batches_trained``; ``epochs_trained`` is derived from ``epoch_len``
    when given, else 0). ``None`` when neither file exists.
    """
    ckpt_dir = pathlib.Path(path)
    file = ckpt_dir / TRIAL_STATE_FILE
    legacy = False
    if not file.is_file():
        file = ckpt_dir / LEGACY_TRIAL_STATE_FILE
        legacy = True
        if not file.is_file():
            return None
    data = _read_plain_pickle(file)
    if not isinstance(data, dict):
        raise CheckpointFormatError(
            f"{file} holds a {type(data).__name__}, expected a dict of trial counters"
        )
    if not legacy:
        return {k: data.get(k, 0 if k != "trial_id" else None) for k in TRIAL_STATE_KEYS}
    batches = data.get("steps_completed", data.get("latest_batch")) or 0
    return {
        "trial_id": data.get("trial_id"),
        "last_ckpt": data.get("last_ckpt", 0) or 0,
        "step_id": data.get("step_id", 0) or 0,
        "last_val": data.get("last_val", 0) or 0,
        "batches_trained": int(batches),
        "epochs_trained": int(batches) // epoch_len if epoch_len else 0,
    }


# --- load_data.json (FIX-5) --------------------------------------------------------


def trial_cls_spec(trial_cls: type, code_root: Optional[PathLike] = None) -> tuple[str, bool]:
    """``("<module>:<qualname>", trial_in_main)`` for ``load_data.json``.

    A class defined in ``__main__`` is recorded under the module name of the
    entry script, relative to ``code_root`` (the directory copied to
    ``code/``) when the script lies inside it: ``python examples/train.py``
    gives ``examples.train``; ``python -m pkg.train`` gives ``pkg.train``.
    """
    module = trial_cls.__module__
    qualname = trial_cls.__qualname__
    if module != "__main__":
        return f"{module}:{qualname}", False
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        return f"{spec.name}:{qualname}", True
    main_file = getattr(main, "__file__", None)
    if not main_file:
        return f":{qualname}", True  # interactive: Determined's reader explains
    script = pathlib.Path(main_file).resolve()
    root = pathlib.Path(code_root or os.getcwd()).resolve()
    try:
        parts = script.with_suffix("").relative_to(root).parts
    except ValueError:
        parts = (script.stem,)
    if not all(p.isidentifier() for p in parts):
        parts = (script.stem,)
    return f"{'.'.join(parts)}:{qualname}", True


def write_load_data(
    path: PathLike,
    trial_cls: type,
    hparams: Optional[Mapping[str, Any]],
    exp_conf: Optional[Mapping[str, Any]],
    is_trainer: bool = True,
    code_root: Optional[PathLike] = None,
) -> dict[str, Any]:
    """Write ``load_data.json`` and return what was written.

    ``is_trainer=False`` for the legacy entrypoint runner (Determined drops
    the key then, and its reader takes the legacy-shim path).
    """
    spec, in_main = trial_cls_spec(trial_cls, code_root)
    data: dict[str, Any] = {
        "trial_type": "PyTorchTrial",
        "experiment_config": _jsonable(exp_conf),
        "hparams": _jsonable(hparams),
        "trial_cls_spec": spec,
    }
    if is_trainer:
        data["is_trainer"] = True
    if in_main:
        data["trial_in_main"] = True
    with open(pathlib.Path(path) / LOAD_DATA_FILE, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return data


def _jsonable(value: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    if value is None:
        return None
    # Round-trip so that what we return equals what a reader will see.
    return dict(json.loads(json.dumps(dict(value), default=_json_default)))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def read_load_data(path: PathLike) -> dict[str, Any]:
    """What a checkpoint says about how to rebuild its trial.

    Returns ``trial_type``, ``experiment_config``, ``hparams``,
    ``trial_cls_spec``, ``is_trainer``, ``trial_in_main`` and ``legacy_metadata``
    (True for checkpoints of Determined <= 0.17.7, described only by the
    ``metadata.json`` that ``Checkpoint.download()`` wrote; those may use the
    ancient ``build_model()`` API).
    """
    ckpt_dir = pathlib.Path(path)
    load_data_file = ckpt_dir / LOAD_DATA_FILE
    if load_data_file.is_file():
        raw = _read_json(load_data_file)
        if raw.get("trial_type") != "PyTorchTrial":
            logger.warning(
                "%s says trial_type=%r, not a PyTorchTrial checkpoint; continuing anyway",
                load_data_file,
                raw.get("trial_type"),
            )
        if not isinstance(raw.get("trial_cls_spec"), str):
            raise CheckpointFormatError(f"{load_data_file} has no trial_cls_spec string")
        return {
            "trial_type": raw.get("trial_type"),
            "experiment_config": raw.get("experiment_config"),
            "hparams": raw.get("hparams"),
            "trial_cls_spec": raw["trial_cls_spec"],
            "is_trainer": bool(raw.get("is_trainer", False)),
            "trial_in_main": bool(raw.get("trial_in_main", False)),
            "legacy_metadata": False,
        }
    metadata_file = ckpt_dir / METADATA_FILE
    metadata = _read_json(metadata_file) if metadata_file.is_file() else {}
    config = metadata.get("experiment_config")
    if isinstance(config, dict) and isinstance(config.get("entrypoint"), str):
        framework = str(metadata.get("framework", ""))
        if not framework.startswith("torch") and "torch_version" not in metadata:
            logger.warning(
                "%s does not look like a PyTorchTrial checkpoint; continuing anyway",
                metadata_file,
            )
        return {
            "trial_type": "PyTorchTrial",
            "experiment_config": config,
            "hparams": metadata.get("hparams"),
            "trial_cls_spec": config["entrypoint"],
            "is_trainer": False,
            "trial_in_main": False,
            "legacy_metadata": True,
        }
    raise CheckpointFormatError(
        f"{ckpt_dir} has no load_data.json (nor a metadata.json with experiment_config "
        "and hparams), so the trial class to rebuild is unknown. Checkpoints of "
        "Determined 0.17.7 and earlier need the metadata.json that Checkpoint.download() "
        "writes; otherwise build the trial yourself (pytorch.CheckpointLoadContext) and "
        "load its state with torch.load"
    )


def _read_json(file: pathlib.Path) -> dict[str, Any]:
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointFormatError(f"{file} is unreadable: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{file} holds a {type(data).__name__}, expected an object")
    return data
