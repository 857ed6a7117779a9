"""The small metadata files of a PyTorchTrial checkpoint: ``trial_state.pkl``
and ``load_data.json`` (part of ``checkpoints.files``, which re-exports all of this).

* ``trial_state.pkl`` is a pickle of a plain dict, as Determined writes it, but
  it is read through an unpickler that only builds builtin scalars and
  containers, so a crafted file cannot run code.
* ``load_data.json`` keeps ``hparams`` even without an experiment config, and
  records a trial class defined in ``__main__`` under an importable name (FIX-5).
"""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import pickle
import sys
from collections.abc import Mapping
from typing import Any, Optional, Union

from determined_launch.errors import InvalidCheckpointException

logger = logging.getLogger("determined_launch.pytorch")

PathLike = Union[str, "os.PathLike[str]"]

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


class CheckpointFormatError(InvalidCheckpointException, AssertionError):
    """A directory is not a readable PyTorchTrial checkpoint.

    Also an ``AssertionError``: Determined raises that for a checkpoint
    without ``load_data.json``/``metadata.json``, and callers may catch it.
    """


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


def read_metadata(path: PathLike) -> dict[str, Any]:
    """The checkpoint's ``metadata.json`` (``{}`` for a directory without one)."""
    metadata_file = pathlib.Path(path) / METADATA_FILE
    return _read_json(metadata_file) if metadata_file.is_file() else {}


def _read_json(file: pathlib.Path) -> dict[str, Any]:
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointFormatError(f"{file} is unreadable: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{file} holds a {type(data).__name__}, expected an object")
    return data
