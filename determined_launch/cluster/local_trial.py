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
* its run directory is ``DET_RUN_DIR``, else ``./det_runs/local`` when that is
  free or this command's, else the command's own (``rundir.default_run_dir``).

``latest_checkpoint``, when nothing set it, is the newest committed checkpoint
of the same run: the same id, hyperparameters and command
(``rundir.newest_committed``), unless ``--fresh`` (``DET_LAUNCH_FRESH``).
Our launchers decide all this once and mark the info ``resolved`` before
handing it to their workers, so every rank sees the same answer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from determined_launch import envvars, rundir, values
from determined_launch.cluster.info import ClusterInfo, TrialInfo
from determined_launch.errors import ClusterInfoError

if TYPE_CHECKING:
    from determined_launch.expconf import ExperimentConfig

HPARAMS_ENV = "DET_LAUNCH_HPARAMS"
CONFIG_ENV = "DET_LAUNCH_CONFIG"
FRESH_ENV = "DET_LAUNCH_FRESH"
LOCAL_TRIAL_ID = 0
# The run directory's names and rules live in rundir.py; these are its names.
RUNS_ROOT = rundir.RUNS_ROOT
LOCAL_RUN_NAME = rundir.LOCAL_RUN_NAME
LATEST_POINTER_FILE = rundir.POINTER_FILE
METADATA_FILE = rundir.METADATA_FILE


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


#: ``complete(command=OWNER)``: no command of its own (``det-launch info``): the run
#: directory's owner, as recorded, and nothing recorded
OWNER: tuple[str, ...] = ("<the run directory's owner>",)


def _command(command: Optional[Sequence[str]]) -> tuple[str, ...]:
    return rundir.command_of(sys.argv if command is None else command)


def default_run_dir(trial: Optional[TrialInfo],
                    command: Optional[Sequence[str]] = None) -> pathlib.Path:
    """``./det_runs/local`` for the local trial (or none), ``./det_runs/trial-<id>``
    for a trial the scheduler or a file named, when free or this command's
    (``rundir.default_run_dir``; ``command``: this process's by default). The
    one rule ``core.init`` and the launchers share."""
    name = rundir.base_name(None if trial is None else trial.trial_id,
                            trial is None or trial.local)
    return rundir.default_run_dir(name, _command(command))


def run_dir_for(trial: TrialInfo, env: Mapping[str, str],
                command: Optional[Sequence[str]] = None) -> pathlib.Path:
    """``DET_RUN_DIR``, else the default run directory."""
    if env.get(envvars.RUN_DIR):
        return pathlib.Path(env[envvars.RUN_DIR]).expanduser().absolute()
    return default_run_dir(trial, command)


def _shared_dir(trial: TrialInfo, env: Mapping[str, str]) -> pathlib.Path:
    """``DET_RUN_DIR``, else ``./det_runs/<local|trial-N>`` whoever owns it."""
    if env.get(envvars.RUN_DIR):
        return pathlib.Path(env[envvars.RUN_DIR]).expanduser().absolute()
    return pathlib.Path(rundir.RUNS_ROOT, rundir.base_name(trial.trial_id, trial.local)
                        ).absolute()


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


def identity(trial: TrialInfo, command: Optional[Sequence[str]]) -> rundir.Identity:
    """The run's identity for ``trial`` run by ``command`` (``None``: any command)."""
    return rundir.Identity(trial.trial_id, trial.local, trial.hparams,
                           None if command is None else rundir.command_key(command))


def _check(storage: Optional[pathlib.Path], is_committed: Optional[Callable[[str], bool]],
           run_dir: pathlib.Path) -> Callable[[str], bool]:
    """The commit check: the marker in the directory ``storage``, else
    ``is_committed`` (object storage, from a layer that can open it). With
    neither, every recorded checkpoint but one being committed is trusted."""
    if storage is not None:
        return rundir.directory_committed(storage)
    return is_committed if is_committed is not None else rundir.trusting(run_dir)


def resume_point(info: ClusterInfo, env: Mapping[str, str], trial: TrialInfo,
                 command: Optional[Sequence[str]],
                 is_committed: Optional[Callable[[str], bool]] = None
                 ) -> tuple[rundir.Resume, pathlib.Path, Optional[pathlib.Path]]:
    """(the resume point, the run directory, its checkpoint directory or ``None``).

    Only the default run directory is the command's: one named by ``DET_RUN_DIR``
    is the user's choice of run, so any command resumes there (a renamed script,
    ``python train.py`` become ``python -m pkg.train``); the lease still keeps it
    to one live job."""
    run_dir = _shared_dir(trial, env) if command is None else run_dir_for(trial, env, command)
    storage = _storage_dir(info, env, run_dir)
    chosen = None if env.get(envvars.RUN_DIR) else command
    resume = rundir.newest_committed(run_dir, identity(trial, chosen),
                                     _check(storage, is_committed, run_dir))
    return resume, run_dir, storage


def newest_committed(info: ClusterInfo, env: Mapping[str, str],
                     is_committed: Optional[Callable[[str], bool]] = None
                     ) -> tuple[Optional[str], Optional[pathlib.Path]]:
    """The newest checkpoint the run directory of ``info``'s trial committed
    for the command that owns it (whatever ``--fresh`` says), and the
    checkpoint directory it is in (``None``: object storage). What
    ``--max-restarts`` resumes from."""
    if info.trial is None:
        return None, None
    run_dir = run_dir_for(info.trial, env)
    resume, _, storage = resume_point(info, env, info.trial, rundir.read_command(run_dir),
                                      is_committed)
    return resume.storage_id, storage


def latest_committed(run_dir: pathlib.Path, storage: Optional[pathlib.Path],
                     trial: TrialInfo, is_committed: Optional[Callable[[str], bool]] = None
                     ) -> Optional[str]:
    """The run directory's newest committed checkpoint of ``trial`` by any
    command (``rundir.newest_committed``)."""
    return rundir.newest_committed(run_dir, identity(trial, None),
                                   _check(storage, is_committed, run_dir)).storage_id


def complete(
    info: ClusterInfo,
    env: Mapping[str, str],
    opts: Optional[LocalTrialOptions] = None,
    say: Optional[Callable[[str], None]] = None,
    is_committed: Optional[Callable[[str], bool]] = None,
    command: Optional[Sequence[str]] = None,
) -> ClusterInfo:
    """``info`` with a trial and a resume point (see the module doc), marked resolved.

    Determined's own info (source ``determined``) and info a launcher already
    resolved are returned as they are. ``is_committed``: the commit-marker
    check of an object storage, from a layer that can open one. ``command``:
    the run's command (this process's ``sys.argv`` by default); on the chief
    it becomes the owner of an existing run directory (``rundir.record_command``).
    """
    if info.resolved or info.source == "determined":
        return info
    opts = opts if opts is not None else LocalTrialOptions.from_env(env)
    trial = info.trial if info.trial is not None else local_trial(opts)
    cmd: Optional[tuple[str, ...]] = _command(command)
    if command is OWNER:
        cmd = rundir.read_command(_shared_dir(trial, env))
    latest = info.latest_checkpoint
    if latest is None and not opts.fresh:
        resume, run_dir, _ = resume_point(info, env, trial, cmd, is_committed)
        latest = resume.storage_id
        if say is not None and cmd is not None:
            _say_resume(say, trial, resume, run_dir, cmd)
    if info.is_chief and cmd is not None and command is not OWNER:
        where = run_dir_for(trial, env, cmd)
        if where.is_dir():  # else its first writer records it (launcher, core's RunDir)
            try:
                rundir.record_command(where, cmd)
            except OSError:
                pass  # an unwritable run directory is reported where it is written
    return dataclasses.replace(info, trial=trial, latest_checkpoint=latest, resolved=True)


def _say_resume(say: Callable[[str], None], trial: TrialInfo, resume: rundir.Resume,
                run_dir: pathlib.Path, command: Sequence[str]) -> None:
    if resume.skipped:
        say(f"trial {trial.trial_id}: {run_dir}: {resume.skipped_line()}")
    if resume.storage_id is not None:
        steps = f" (steps_completed {resume.steps})" if resume.steps is not None else ""
        # The script decides whether to resume (a Trainer needs fit(latest_checkpoint=)),
        # so this says what is there, not what will happen.
        say(f"trial {trial.trial_id}: info.latest_checkpoint is {resume.storage_id}{steps}, "
            f"the newest committed checkpoint of `{rundir.show(command)}` in {run_dir}; a "
            f"script that passes it on resumes from it (--fresh / {FRESH_ENV}=1 starts over)")
        return
    owner = rundir.read_command(run_dir)
    if owner is not None and owner != tuple(command) and rundir.newest_committed(
            run_dir, identity(trial, None), lambda _sid: True).storage_id is not None:
        say(f"trial {trial.trial_id}: {run_dir} holds checkpoints of `{rundir.show(owner)}`; "
            f"`{rundir.show(command)}` does not resume from them (another command, another "
            f"run)")
