"""Determined's experiment config: the one reader, for ``det-launch
experiment``, ``det-launch --config`` and the legacy runner (``python -m
determined_launch.pytorch --config``), so a file is checked the same way
whichever reads it. Pure (standard library, PyYAML when reading YAML).

Only what a search needs is interpreted: ``hyperparameters``, ``searcher``,
``entrypoint`` (or seed 000's ``entrypoint_script``, after its ``launch_layer`` if any),
``resources.slots_per_trial``,
``max_restarts``, ``checkpoint_storage`` (passed through to the trials untouched), ``name`` and
``reproducibility.experiment_seed``. Fields that only mean something to
Determined's master (``environment``, ``bind_mounts``, ...) are accepted and
listed once as ignored, so a config written for Determined runs unchanged; any
other field is a typo until proven otherwise and fails with one line naming the
file and the field, with the close match when there is one (``min_validaton_period
(did you mean min_validation_period?)``). One trial (``load(path, trial=True)``)
needs no ``searcher`` and no ``name``; what it gives is checked the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from determined_launch import hparams as hp
from determined_launch import values
from determined_launch.errors import LaunchError

SEARCHERS = ("single", "grid", "random", "adaptive_asha", "async_halving")
ASHA_MODES = ("aggressive", "standard", "conservative")
UNITS = ("batches", "records", "epochs")

#: Top-level fields this layer interprets.
_USED = {"name", "hyperparameters", "searcher", "entrypoint", "resources", "max_restarts",
         "checkpoint_storage", "reproducibility", "entrypoint_script", "launch_layer"}
#: Determined-only fields a config written for a cluster usually has, each with why
#: it is not needed here (one line each, instead of a place in the ignored list)
NOT_NEEDED = {
    "bind_mounts": "not needed off-cluster: trials run on this machine's file system "
                   "(checkpoints go to checkpoint_storage, default the run directory)",
}
#: Top-level fields that only Determined's master or its containers use.
_IGNORED = {"description", "labels", "data", "environment", "bind_mounts", "checkpoint_policy",
            "min_validation_period", "min_checkpoint_period", "records_per_epoch",
            "scheduling_unit", "optimizations", "profiling", "project", "workspace",
            "tensorboard_storage", "perform_initial_validation", "debug", "integrations",
            "log_policies", "notes", "pbs", "slurm", "preemption_timeout",
            "internal", "retention_policy", "security", "workdir", "max_trial_runtime"}
_SEARCHER_FIELDS: dict[str, set[str]] = {
    "single": {"max_length"},
    "grid": {"max_length", "max_concurrent_trials"},
    "random": {"max_length", "max_trials", "max_concurrent_trials"},
    "adaptive_asha": {"max_length", "max_trials", "max_concurrent_trials", "mode", "divisor",
                      "max_rungs", "bracket_rungs", "stop_once"},
    "async_halving": {"max_length", "max_trials", "max_concurrent_trials", "divisor",
                      "num_rungs", "stop_once"},
}
_SEARCHER_COMMON = {"name", "metric", "smaller_is_better", "time_metric", "max_time"}
_SEARCHER_IGNORED = {"source_trial_id", "source_checkpoint_uuid", "unit"}
#: Determined's fields of the sections the legacy runner (or a seed) reads
_SECTION_FIELDS: dict[str, set[str]] = {
    "optimizations": {"aggregation_frequency", "average_aggregated_gradients",
                      "average_training_metrics", "gradient_compression",
                      "grad_updates_size_file", "mixed_precision", "tensor_fusion_threshold",
                      "tensor_fusion_cycle_time", "auto_tune_tensor_fusion"},
    "profiling": {"enabled", "begin_on_batch", "end_after_batch", "sync_timings"},
    "reproducibility": {"experiment_seed"},
}
#: ``resources`` fields besides ``slots_per_trial``: Determined's scheduler's
_RESOURCES_IGNORED = {"slots", "max_slots", "weight", "priority", "resource_pool", "shm_size",
                      "agent_label", "devices", "native_parallel", "is_single_node"}


class ConfigError(LaunchError):
    """The experiment config is unusable; the message names the file and field."""


@dataclasses.dataclass(frozen=True)
class SearcherConfig:
    name: str
    metric: str
    smaller_is_better: bool
    #: the trial length the searcher works in (``max_length``'s count, or ``max_time``)
    max_length: Optional[int]
    #: ``batches``/``records``/``epochs`` when ``max_length`` named one, else None
    unit: Optional[str]
    #: 0.38's ``time_metric``: the validation metric that measures a trial's length
    time_metric: Optional[str]
    max_trials: int
    max_concurrent_trials: int
    mode: str = "standard"
    divisor: float = 4.0
    max_rungs: int = 5
    bracket_rungs: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    path: pathlib.Path
    name: str
    space: hp.Space
    searcher: SearcherConfig
    entrypoint: Optional[tuple[str, ...]]
    slots_per_trial: Optional[int]
    max_restarts: int
    #: passed to trials as ``DET_CHECKPOINT_STORAGE``, never parsed here
    checkpoint_storage: Optional[Any]
    experiment_seed: int
    ignored: tuple[str, ...]
    raw: Mapping[str, Any]


def load(path: Union[str, pathlib.Path], *, trial: bool = False) -> ExperimentConfig:
    """Read and check ``path``; every mistake is one line naming the file and field.
    ``trial``: the config of one trial (see the module doc)."""
    path = pathlib.Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = values.yaml_document(text, where, "pip install 'determined_launch[search]'")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if raw is None and trial:
        raw = {}  # an empty file: one trial with nothing configured
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of experiment config fields")
    return parse(raw, path, trial=trial)


def _check_known(raw: Mapping[str, Any], known: set[str], where: str, tail: str = "") -> None:
    unknown = sorted(str(k) for k in raw if k not in known)
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        named.append(f"{key} (did you mean {close[0]}?)" if close else key)
    raise ConfigError(f"{where}unknown field(s) {', '.join(named)}{tail}")


#: what one trial's config gets when it names no searcher
_NO_SEARCHER = SearcherConfig(name="single", metric="validation_loss", smaller_is_better=True,
                              max_length=None, unit=None, time_metric=None, max_trials=1,
                              max_concurrent_trials=1)


def parse(raw: Mapping[str, Any], path: pathlib.Path, *, trial: bool = False) -> ExperimentConfig:
    where = str(path)
    _check_known(raw, _USED | _IGNORED, f"{where}: ")
    for section, fields in _SECTION_FIELDS.items():
        if isinstance(raw.get(section), Mapping):
            _check_known(raw[section], fields, f"{where}: {section}: ")
    try:
        space = hp.parse_hyperparameters(raw.get("hyperparameters"))
    except hp.HParamError as e:
        raise ConfigError(f"{where}: {e}") from None
    if trial and raw.get("searcher") is None:
        searcher = _NO_SEARCHER
    else:
        searcher = _searcher(raw.get("searcher"), where)
    ignored = sorted(k for k in raw if k in _IGNORED)
    ignored += sorted(f"searcher.{k}" for k in (raw.get("searcher") or {})
                      if k in _SEARCHER_IGNORED)
    resources = raw.get("resources") or {}
    if not isinstance(resources, dict):
        raise ConfigError(f"{where}: resources: expected a mapping")
    _check_known(resources, _RESOURCES_IGNORED | {"slots_per_trial"}, f"{where}: resources: ")
    slots = resources.get("slots_per_trial")
    if slots is not None:
        slots = _int(slots, f"{where}: resources.slots_per_trial", minimum=1)
    ignored += sorted(f"resources.{k}" for k in resources if k != "slots_per_trial")
    seed = (raw.get("reproducibility") or {}).get("experiment_seed", 0)
    name = raw.get("name") or path.stem
    checked = raw.get("name") or not trial  # one trial's config names no directory
    if checked and (not isinstance(name, str)
                    or not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name)):
        raise ConfigError(f"{where}: name: {name!r}: use letters, digits, '_', '.', '-' "
                          "(it names the experiment's directory and study)")
    return ExperimentConfig(
        path=path, name=name, space=space, searcher=searcher,
        entrypoint=_launch_layer(raw, _entrypoint(_entrypoint_field(raw, where), where), where),
        slots_per_trial=slots,
        max_restarts=_int(raw.get("max_restarts", 5), f"{where}: max_restarts", minimum=0),
        checkpoint_storage=raw.get("checkpoint_storage"),
        experiment_seed=_int(seed, f"{where}: reproducibility.experiment_seed", minimum=0),
        ignored=tuple(ignored), raw=raw)


def _searcher(raw: Any, where: str) -> SearcherConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: searcher: expected a mapping with at least name and metric")
    name = raw.get("name")
    if name not in SEARCHERS:
        raise ConfigError(f"{where}: searcher.name: unknown searcher {name!r} "
                          f"(expected one of {', '.join(SEARCHERS)})")
    allowed = _SEARCHER_FIELDS[name] | _SEARCHER_COMMON | _SEARCHER_IGNORED
    _check_known(raw, allowed, f"{where}: searcher: ", f" for searcher {name}")
    metric = raw.get("metric", "validation_loss" if name == "single" else None)
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"{where}: searcher.metric: expected the name of a validation metric")
    smaller = raw.get("smaller_is_better", True)
    if not isinstance(smaller, bool):
        raise ConfigError(f"{where}: searcher.smaller_is_better: expected true or false")
    max_length, unit = _length(raw.get("max_length"), f"{where}: searcher.max_length")
    time_metric = raw.get("time_metric")
    if time_metric is not None or "max_time" in raw:
        if max_length is not None:
            raise ConfigError(f"{where}: searcher: give max_length or time_metric + max_time, "
                              "not both")
        if not isinstance(time_metric, str) or not time_metric:
            raise ConfigError(f"{where}: searcher.time_metric: expected the name of a "
                              "validation metric (with max_time)")
        max_length = _int(raw.get("max_time"), f"{where}: searcher.max_time", minimum=1)
    if name == "adaptive_asha" or name == "async_halving":
        if max_length is None:
            raise ConfigError(f"{where}: searcher: {name} needs max_length (or time_metric "
                              "and max_time)")
    default_trials = 1 if name == "single" else None
    max_trials = raw.get("max_trials", default_trials)
    if name != "grid":
        if max_trials is None:
            raise ConfigError(f"{where}: searcher.max_trials: required for searcher {name}")
        max_trials = _int(max_trials, f"{where}: searcher.max_trials", minimum=1)
    else:
        max_trials = 0  # the grid's size, known once the space is
    # 0: unset (det-launch experiment's default: experiment/concurrency.py)
    concurrent = _int(raw.get("max_concurrent_trials", 0), f"{where}: "
                      "searcher.max_concurrent_trials", minimum=0)
    out = SearcherConfig(name=name, metric=metric, smaller_is_better=smaller,
                         max_length=max_length, unit=unit, time_metric=time_metric,
                         max_trials=max_trials, max_concurrent_trials=concurrent)
    if name in ("adaptive_asha", "async_halving"):
        mode = raw.get("mode", "standard" if name == "adaptive_asha" else "aggressive")
        if mode not in ASHA_MODES:
            raise ConfigError(f"{where}: searcher.mode: {mode!r} (expected one of "
                              f"{', '.join(ASHA_MODES)})")
        divisor = raw.get("divisor", 4)
        if isinstance(divisor, bool) or not isinstance(divisor, (int, float)) or divisor <= 1:
            raise ConfigError(f"{where}: searcher.divisor: expected a number > 1, got "
                              f"{divisor!r}")
        rungs_field = "num_rungs" if name == "async_halving" else "max_rungs"
        rungs = _int(raw.get(rungs_field, 5), f"{where}: searcher.{rungs_field}", minimum=1)
        brackets = raw.get("bracket_rungs") or []
        if not isinstance(brackets, list) or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in brackets):
            raise ConfigError(f"{where}: searcher.bracket_rungs: expected a list of positive "
                              "integers")
        out = dataclasses.replace(out, mode=mode, divisor=float(divisor), max_rungs=rungs,
                                  bracket_rungs=tuple(brackets))
    return out


def _length(raw: Any, field: str) -> tuple[Optional[int], Optional[str]]:
    """``max_length: 64`` or ``max_length: {batches: 64}`` (Determined's forms)."""
    if raw is None:
        return None, None
    if isinstance(raw, dict):
        if len(raw) != 1 or next(iter(raw)) not in UNITS:
            raise ConfigError(f"{field}: expected an integer or one of "
                              f"{{{'|'.join(UNITS)}: N}}, got {json.dumps(raw)}")
        unit, value = next(iter(raw.items()))
        return _int(value, f"{field}.{unit}", minimum=1), unit
    return _int(raw, field, minimum=1), None


def _int(raw: Any, field: str, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise ConfigError(f"{field}: expected an integer >= {minimum}, got {raw!r}")
    return raw


def _entrypoint_field(raw: Mapping[str, Any], where: str) -> Any:
    """``entrypoint``, or seed 000's spelling of it, ``entrypoint_script``."""
    if "entrypoint" in raw and "entrypoint_script" in raw:
        raise ConfigError(f"{where}: give entrypoint or entrypoint_script (seed 000's name "
                          "for it), not both")
    return raw.get("entrypoint", raw.get("entrypoint_script"))


def ignored_lines(fields: Sequence[str]) -> list[str]:
    """What to say about the Determined-only fields a run ignores: one line for each
    field of ``NOT_NEEDED``, then one naming the rest."""
    lines = [f"{f}: {NOT_NEEDED[f]}" for f in fields if f in NOT_NEEDED]
    rest = [f for f in fields if f not in NOT_NEEDED]
    if rest:
        lines.append(f"ignoring Determined-only fields: {', '.join(rest)}")
    return lines


def _launch_layer(raw: Mapping[str, Any], entrypoint: Optional[tuple[str, ...]],
                  where: str) -> Optional[tuple[str, ...]]:
    """Seed 000's ``launch_layer``: a launcher command put in front of the
    entrypoint (``python3 -m determined.launch.torch_distributed`` +
    ``python3 train.py``), which then runs as Determined's entrypoint would."""
    layer = _entrypoint(raw.get("launch_layer"), where, "launch_layer")
    if layer is None:
        return entrypoint
    if entrypoint is None:
        raise ConfigError(f"{where}: launch_layer: needs an entrypoint_script (or entrypoint) "
                          "to launch")
    return layer + entrypoint


def _entrypoint(raw: Any, where: str, field: str = "entrypoint") -> Optional[tuple[str, ...]]:
    """A string (split like a shell would) or a list of strings."""
    if raw is None:
        return None
    import shlex

    if isinstance(raw, str):
        try:
            words = shlex.split(raw)
        except ValueError as e:
            raise ConfigError(f"{where}: {field}: {e}") from None
    elif isinstance(raw, list) and all(isinstance(w, str) for w in raw):
        words = list(raw)
    else:
        raise ConfigError(f"{where}: {field}: expected a string or a list of strings")
    if not words:
        raise ConfigError(f"{where}: {field}: empty")
    return tuple(words)
