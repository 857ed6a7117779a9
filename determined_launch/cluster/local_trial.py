"""A trial off-cluster, and resuming it when the same command runs again.

Determined hands every trial its identity, hyperparameters and the checkpoint
to resume from. When nothing did (no trial in the cluster info), the trial
is *the local trial* of the run directory:

* ``trial_id`` 0 (the PyTorch API's local trial), ``trial_seed`` the config's
  ``reproducibility.experiment_seed`` or 0, ``local`` true;
* ``hparams`` from ``--hparams JSON|FILE`` (``DET_LAUNCH_HPARAMS``), else the
  constants of the ``hyperparameters`` block of ``--config EXP.yaml``
  (``DET_LAUNCH_CONFIG``), else none (a missing key then names those two);
* ``max_length`` the config's ``searcher.max_length``; its metric and unit
  reach the workers as ``det-launch experiment``'s trials get them
  (``searcher_env``);
* its run directory is ``DET_RUN_DIR``, else ``./det_runs/local``, as before
  trials existed off-cluster, so existing run directories keep working.

``latest_checkpoint``, when nothing set it, is the newest checkpoint this run
directory committed for the same trial, i.e. the same id and hyperparameters
(``latest_checkpoint.json``, checked against the checkpoint storage), unless
``--fresh`` (``DET_LAUNCH_FRESH``).
Our launchers decide all this once and mark the info ``resolved`` before
handing it to their workers, so every rank sees the same answer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from determined_launch import envvars, values
from determined_launch.cluster.info import ClusterInfo, TrialInfo
from determined_launch.errors import ClusterInfoError

if TYPE_CHECKING:
    from determined_launch.expconf import ExperimentConfig

HPARAMS_ENV = "DET_LAUNCH_HPARAMS"
CONFIG_ENV = "DET_LAUNCH_CONFIG"
FRESH_ENV = "DET_LAUNCH_FRESH"
LOCAL_TRIAL_ID = 0
#: Parent of the default run directories, relative to the working directory.
RUNS_ROOT = "det_runs"
LOCAL_RUN_NAME = "local"
#: Files the local Core API keeps (core/checkpoint.py writes them).
LATEST_POINTER_FILE = "latest_checkpoint.json"
METADATA_FILE = "metadata.json"


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path}: cannot read: {getattr(e, 'strerror', None) or e}"
                         ) from None


def _load_yaml(text: str, where: str) -> Any:
    return values.yaml_document(
        text, where, "pip install 'determined_launch[torch]' (or pip install pyyaml)")


def parse_hparams(raw: str) -> dict[str, Any]:
    """``--hparams``: a JSON object, or a file holding one (``.yaml``/``.yml``: YAML)."""
    text, where = raw.strip(), "JSON"
    if not text.startswith(("{", "[")):
        where = f"file {text}"
        text = _read_text(text, "file")
        if raw.strip().endswith((".yaml", ".yml")):
            data = _load_yaml(text, where)
            return _object(data, where)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
                         ) from None
    return _object(data, where)


def _object(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object of hyperparameters, "
                         f"got {type(data).__name__}")
    return data


def read_config(path: str) -> dict[str, Any]:
    """``--config EXP.yaml``: Determined's experiment config, as a mapping,
    checked as ``det-launch experiment`` checks it (one trial: no searcher needed)."""
    from determined_launch import expconf  # a pure leaf, like hparams

    try:
        return dict(expconf.load(path, trial=True).raw)
    except expconf.ConfigError as e:
        raise ValueError(str(e)) from None


def config_hparams(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The constants of the config's ``hyperparameters`` block (a range is an
    error: one trial needs one value; ``det-launch experiment`` searches)."""
    # A pure, standard-library leaf (the only part of experiment/ below it may import).
    from determined_launch.hparams import (
        HParamError,
        constants,
        parse_hyperparameters,
    )

    block = config.get("hyperparameters")
    if block is None:
        return {}
    try:
        return constants(parse_hyperparameters(block))
    except HParamError as e:
        raise ValueError(f"{where}: {e}") from None


def config_seed(config: Mapping[str, Any]) -> int:
    repro = config.get("reproducibility")
    seed = repro.get("experiment_seed") if isinstance(repro, Mapping) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else 0


@dataclasses.dataclass(frozen=True)
class LocalTrialOptions:
    """The launcher's ``--hparams``, ``--config`` and ``--fresh`` (or their variables)."""

    hparams: Optional[str] = None
    config: Optional[str] = None
    fresh: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LocalTrialOptions:
        fresh_raw = env.get(FRESH_ENV, "").strip()
        try:
            fresh = values.boolean(fresh_raw) if fresh_raw else False
        except ValueError as e:
            raise ClusterInfoError(f"environment variable {FRESH_ENV}: {e}") from None
        return cls(hparams=env.get(HPARAMS_ENV) or None, config=env.get(CONFIG_ENV) or None,
                   fresh=fresh)


def _load(opts: LocalTrialOptions) -> Optional[ExperimentConfig]:
    """``--config``, read and checked by the one config reader (one trial)."""
    if not opts.config:
        return None
    from determined_launch import expconf  # a pure leaf, like hparams

    try:
        return expconf.load(opts.config, trial=True)
    except expconf.ConfigError as e:
        raise ClusterInfoError(f"--config / {CONFIG_ENV}: {e}") from None


def searcher_env(opts: LocalTrialOptions, env: Mapping[str, str]) -> dict[str, str]:
    """``--config``'s searcher metric, direction and unit, as the variables
    ``det-launch experiment`` hands its trials (retention ranks checkpoints by
    the metric, ``get_configured_units()`` reads the unit), where ``env`` does
    not already set them."""
    conf = _load(opts)
    if conf is None or conf.raw.get("searcher") is None:
        return {}
    searcher = conf.searcher
    out = {envvars.SEARCHER_METRIC: searcher.metric,
           envvars.SMALLER_IS_BETTER: "true" if searcher.smaller_is_better else "false"}
    if searcher.unit is not None:
        out[envvars.SEARCHER_UNIT] = searcher.unit.upper()
    return {k: v for k, v in out.items() if not env.get(k)}


def local_trial(opts: LocalTrialOptions) -> TrialInfo:
    """The local trial: hyperparameters, seed and length from the options."""
    hparams: dict[str, Any] = {}
    conf = _load(opts)
    config = dict(conf.raw) if conf is not None else {}
    seed = config_seed(config)
    # The searcher's length (0.38's max_time is a metric's, not the trial's).
    max_length = (conf.searcher.max_length
                  if conf is not None and conf.searcher.time_metric is None else None)
    try:
        if opts.hparams:
            hparams = parse_hparams(opts.hparams)
        elif opts.config:
            hparams = config_hparams(config, f"config {opts.config}")
    except ValueError as e:
        which = f"--hparams / {HPARAMS_ENV}" if opts.hparams else f"--config / {CONFIG_ENV}"
        raise ClusterInfoError(f"{which}: {e}") from None
    return TrialInfo(trial_id=LOCAL_TRIAL_ID, hparams=hparams, trial_seed=seed,
                     max_length=max_length, local=True)


def default_run_dir(trial: Optional[TrialInfo]) -> pathlib.Path:
    """``./det_runs/local`` for the local trial (or none), ``./det_runs/trial-<id>``
    for a trial the scheduler or a file named. The one rule ``core.init`` and
    the launchers share."""
    name = LOCAL_RUN_NAME if trial is None or trial.local else f"trial-{trial.trial_id}"
    return pathlib.Path(RUNS_ROOT, name).absolute()


def run_dir_for(trial: TrialInfo, env: Mapping[str, str]) -> pathlib.Path:
    """``DET_RUN_DIR``, else the default run directory."""
    if env.get(envvars.RUN_DIR):
        return pathlib.Path(env[envvars.RUN_DIR]).expanduser().absolute()
    return default_run_dir(trial)


def _storage_dir(info: ClusterInfo, env: Mapping[str, str],
                 run_dir: pathlib.Path) -> Optional[pathlib.Path]:
    """The checkpoint directory ``core.init`` would use, when it is one we
    can look into; ``None`` for object storage and storage blocks."""
    raw = (env.get(envvars.CHECKPOINT_STORAGE) or getattr(info, "checkpoint_storage", None)
           or str(run_dir.parent / "checkpoints"))
    if not isinstance(raw, str):
        return None
    if raw.startswith("file://"):
        raw = raw[len("file://"):]
    if "://" in raw:
        return None
    if raw.endswith((".yaml", ".yml")) and not os.path.isdir(raw):
        return None  # a storage block in a file (core/storage/spec.py reads it the same way)
    return pathlib.Path(raw).expanduser().absolute()


def latest_committed(run_dir: pathlib.Path, storage: Optional[pathlib.Path],
                     trial: TrialInfo, is_committed: Optional[Callable[[str], bool]] = None
                     ) -> Optional[str]:
    """The run directory's newest committed checkpoint of ``trial``, if any.

    ``latest_checkpoint.json`` names it under ``storage_id`` (while a commit
    is under way, the new one under ``pending``). As ``core``'s
    ``checkpoint.latest()``: the newest whose commit marker is there, looked
    for in the directory ``storage``, else by ``is_committed`` (object
    storage: a save killed after its marker but before the pointer's second
    write left ``pending`` committed and newer). With neither, the pointer's
    ``storage_id`` is trusted.
    """
    try:
        with open(run_dir / LATEST_POINTER_FILE, encoding="utf-8") as f:
            pointer = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(pointer, dict):
        return None
    # Same trial: same id and same hyperparameters (pointers written before
    # either was recorded match any trial).
    recorded = pointer.get("trial_id", "absent")
    if recorded not in ("absent", trial.trial_id) and not (trial.local and recorded is None):
        return None
    recorded_hparams = pointer.get("hparams")
    if recorded_hparams is not None and recorded_hparams != json.loads(
            json.dumps(dict(trial.hparams), default=str)):
        return None
    for key in ("pending", "storage_id"):
        storage_id = pointer.get(key)
        if not isinstance(storage_id, str) or "/" in storage_id or storage_id.startswith("."):
            continue
        if storage is not None:
            if (storage / storage_id / METADATA_FILE).is_file():
                return storage_id
        elif is_committed is not None:
            if is_committed(storage_id):
                return storage_id
        elif key == "storage_id":
            return storage_id
    return None


def newest_committed(info: ClusterInfo, env: Mapping[str, str],
                     is_committed: Optional[Callable[[str], bool]] = None
                     ) -> tuple[Optional[str], Optional[pathlib.Path]]:
    """The newest checkpoint the run directory of ``info``'s trial committed
    (as ``complete`` finds it, whatever ``--fresh`` says), and the checkpoint
    directory it is in (``None``: object storage). What ``--max-restarts``
    resumes from."""
    if info.trial is None:
        return None, None
    run_dir = run_dir_for(info.trial, env)
    storage = _storage_dir(info, env, run_dir)
    return latest_committed(run_dir, storage, info.trial, is_committed), storage


def complete(
    info: ClusterInfo,
    env: Mapping[str, str],
    opts: Optional[LocalTrialOptions] = None,
    say: Optional[Callable[[str], None]] = None,
    is_committed: Optional[Callable[[str], bool]] = None,
) -> ClusterInfo:
    """``info`` with a trial and a resume point (see the module doc), marked resolved.

    Determined's own info (source ``determined``) and info a launcher already
    resolved are returned as they are. ``is_committed``: the commit-marker
    check of an object storage (``latest_committed``), from a layer that can
    open one.
    """
    if info.resolved or info.source == "determined":
        return info
    opts = opts if opts is not None else LocalTrialOptions.from_env(env)
    trial = info.trial if info.trial is not None else local_trial(opts)
    latest = info.latest_checkpoint
    if latest is None and not opts.fresh:
        run_dir = run_dir_for(trial, env)
        latest = latest_committed(run_dir, _storage_dir(info, env, run_dir), trial,
                                  is_committed)
        if latest is not None and say is not None:
            # The script decides whether to resume (a Trainer needs fit(latest_checkpoint=)),
            # so this says what is there, not what will happen.
            say(f"trial {trial.trial_id}: info.latest_checkpoint is {latest}, the newest in "
                f"{run_dir}; a script that passes it on resumes from it (--fresh / "
                f"{FRESH_ENV}=1 starts over)")
    return dataclasses.replace(info, trial=trial, latest_checkpoint=latest, resolved=True)
