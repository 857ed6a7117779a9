"""The legacy entrypoint runner's pure part: experiment config -> Trainer arguments.

Before the Trainer API, a Determined experiment was ``model_def.py`` plus a
config with ``entrypoint: model_def:MyTrial``; Determined's harness
(``exec/harness.py``) turned the config into ``pytorch.init(...)`` and
``Trainer.fit(...)`` arguments. ``plan_run`` makes the same mapping (spec
2.11) without touching torch, so it is unit-testable; ``__main__.py`` runs it.

Mapping (config key -> argument, default when absent):

* ``hyperparameters`` -> ``init(hparams=...)``; ``{type: const, val: v}`` and
  bare values resolve to ``v``, nested groups recurse; ranges (int, double,
  log, categorical) need a value from ``--hparam NAME=VALUE`` (there is no
  searcher here to pick one). A trial cluster-info file's ``trial.hparams``
  (what a master would have chosen) replaces them.
* ``optimizations.aggregation_frequency`` (1), ``gradient_compression``
  (False), ``average_aggregated_gradients`` (True).
* ``min_checkpoint_period``/``min_validation_period`` ({batches: 0} = never)
  -> ``TrainUnit._from_values(..., global_batch_size=hparams.global_batch_size)``.
* ``scheduling_unit`` (100) -> ``reporting_period=Batch(n)``;
  ``checkpoint_policy`` ("best"); ``perform_initial_validation`` (False) ->
  ``step_zero_validation``; ``profiling.enabled`` (False).
* ``searcher.max_length`` ({batches|records|epochs: n}, or an int of
  batches) -> ``max_length``; Determined 0.38 fell back to it when ``fit`` got
  none. ``records_per_epoch`` is ignored, as Determined ignores it.
* ``latest_checkpoint``: ``--latest-checkpoint``, else the cluster info's,
  else ``"latest"`` (this run directory's newest checkpoint, FIX-10), so
  rerunning the same command resumes after a preemption.
* ``--test``: ``fit(max_length=Batch(1), test_mode=True)`` (Determined's
  ``test_one_batch``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from determined_launch.errors import LaunchError
from determined_launch.pytorch._units import Batch, TrainUnit

RANGE_TYPES = ("int", "double", "log", "categorical")


class RunnerError(LaunchError):
    """A usage or configuration mistake: one line, exit status 2."""


@dataclasses.dataclass
class RunPlan:
    """Everything ``__main__`` needs to start the trial."""

    entrypoint: str
    hparams: dict[str, Any]
    exp_conf: Optional[dict[str, Any]]
    aggregation_frequency: int = 1
    gradient_compression: bool = False
    average_aggregated_gradients: bool = True
    fit_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


# --- config file ------------------------------------------------------------------


def read_config(path: str) -> dict[str, Any]:
    """Load an experiment config (YAML, or JSON), checked as ``det-launch
    experiment`` checks it (``determined_launch.expconf``, one trial: no
    searcher needed). ``RunnerError`` on any problem."""
    from determined_launch import expconf

    try:
        return dict(expconf.load(path, trial=True).raw)
    except expconf.ConfigError as e:
        raise RunnerError(str(e)) from None


def parse_value(text: str) -> Any:
    """A ``--hparam`` value: YAML/JSON scalar or structure if it parses, else the string."""
    try:
        import yaml

        return yaml.safe_load(text)
    except Exception:
        try:
            return json.loads(text)
        except ValueError:
            return text


# --- hyperparameters ----------------------------------------------------------------


def resolve_hparams(
    spec: Any, overrides: Optional[Mapping[str, Any]] = None, _prefix: str = ""
) -> dict[str, Any]:
    """Concrete values from a ``hyperparameters`` section; ``overrides`` maps
    dotted names (``optim.lr``) to values and wins over the config."""
    overrides = overrides or {}
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise RunnerError(
            f"hyperparameters{' ' + _prefix.rstrip('.') if _prefix else ''} must be a "
            f"mapping of names to values, got {spec!r}"
        )
    out: dict[str, Any] = {}
    for name, value in spec.items():
        dotted = f"{_prefix}{name}"
        if dotted in overrides:
            out[name] = overrides[dotted]
        elif isinstance(value, Mapping) and "type" in value:
            out[name] = _resolve_one(dotted, value)
        elif isinstance(value, Mapping):
            out[name] = resolve_hparams(value, overrides, f"{dotted}.")
        else:
            out[name] = value
    if not _prefix:  # top level: overrides also add names the config lacks
        for dotted, value in overrides.items():
            _set_dotted(out, dotted, value)
    return out


def _set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise RunnerError(f"--hparam {dotted}: {part!r} is a value, not a group")
        target = child
    target[leaf] = value


def _resolve_one(name: str, value: Mapping[str, Any]) -> Any:
    kind = value.get("type")
    if kind == "const":
        if "val" not in value:
            raise RunnerError(f"hyperparameter {name!r} is type const but has no 'val'")
        return value["val"]
    if kind == "object":  # Determined's nested-group spelling
        return resolve_hparams(value.get("vals", {}), None, f"{name}.")
    if kind in RANGE_TYPES:
        raise RunnerError(
            f"hyperparameter {name!r} is a {kind!r} range, and this runner trains one trial "
            f"with no searcher: give it a value with --hparam {name}=VALUE, or make it "
            "'type: const'"
        )
    raise RunnerError(
        f"hyperparameter {name!r} has unknown type {kind!r}; use const, int, double, log, "
        "categorical or object"
    )


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise RunnerError(f"--hparam expects NAME=VALUE, got {item!r}")
        out[name.strip()] = parse_value(raw)
    return out


# --- config sections ------------------------------------------------------------------


def _section(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RunnerError(f"config key {key!r} must be a mapping, got {value!r}")
    return value


def _int(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RunnerError(f"config key {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise RunnerError(f"config key {key!r} must be true or false, got {value!r}")
    return value


def _length(value: Any, key: str, gbs: Optional[int]) -> TrainUnit:
    """``{batches: n}``/``{records: n}``/``{epochs: n}`` (or an int of batches)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return TrainUnit._from_values(batches=value)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise RunnerError(
            f"config key {key!r} must be one of {{batches: N}}, {{records: N}} or "
            f"{{epochs: N}}, got {value!r}"
        )
    unit, n = next(iter(value.items()))
    if unit not in ("batches", "records", "epochs"):
        raise RunnerError(
            f"config key {key!r}: unknown unit {unit!r}; use batches, records or epochs"
        )
    if isinstance(n, bool) or not isinstance(n, int):
        raise RunnerError(f"config key {key!r}: {unit} must be an integer, got {n!r}")
    if unit == "records" and gbs is None:
        raise RunnerError(
            f"config key {key!r} is in records, which needs hyperparameter global_batch_size"
        )
    return TrainUnit._from_values(**{unit: n}, global_batch_size=gbs)


def _global_batch_size(hparams: Mapping[str, Any]) -> Optional[int]:
    if "global_batch_size" not in hparams:
        return None
    try:
        return int(hparams["global_batch_size"])
    except (TypeError, ValueError):
        raise RunnerError(
            f"hyperparameter global_batch_size must be an integer, got "
            f"{hparams['global_batch_size']!r}"
        ) from None


def plan_run(
    config: Optional[Mapping[str, Any]],
    entrypoint: Optional[str] = None,
    *,
    test_mode: bool = False,
    hparam_overrides: Optional[Mapping[str, Any]] = None,
    trial_hparams: Optional[Mapping[str, Any]] = None,
    latest_checkpoint: Optional[str] = None,
    info_latest_checkpoint: Optional[str] = None,
) -> RunPlan:
    """Map a Determined experiment config to ``init``/``fit`` arguments (see module doc)."""
    cfg: Mapping[str, Any] = config or {}
    entry = entrypoint or cfg.get("entrypoint")
    if not isinstance(entry, str) or ":" not in entry or " " in entry.strip():
        got = f"config entrypoint {entry!r}" if entry else "no entrypoint"
        raise RunnerError(f"give the trial class as MODULE:CLASS (e.g. model_def:MyTrial); {got}")
    if trial_hparams:
        hparams = dict(trial_hparams)
        hparams.update(hparam_overrides or {})
    else:
        hparams = resolve_hparams(cfg.get("hyperparameters"), hparam_overrides)
    gbs = _global_batch_size(hparams)

    opt = _section(cfg, "optimizations")
    plan = RunPlan(
        entrypoint=entry.strip(),
        hparams=hparams,
        exp_conf=dict(cfg) if config is not None else None,
        aggregation_frequency=_int(
            opt.get("aggregation_frequency", 1), "optimizations.aggregation_frequency", 1
        ),
        gradient_compression=_bool(
            opt.get("gradient_compression", False), "optimizations.gradient_compression"
        ),
        average_aggregated_gradients=_bool(
            opt.get("average_aggregated_gradients", True),
            "optimizations.average_aggregated_gradients",
        ),
    )
    if test_mode:
        plan.fit_kwargs = {"max_length": Batch(1), "test_mode": True}
        return plan

    policy = cfg.get("checkpoint_policy")  # None: fit()'s default, "best", without its warning
    if policy not in (None, "best", "all", "none"):
        raise RunnerError(
            f"config key 'checkpoint_policy' must be best, all or none, got {policy!r}"
        )
    fit: dict[str, Any] = {
        "checkpoint_period": _length(
            cfg.get("min_checkpoint_period", {"batches": 0}), "min_checkpoint_period", gbs
        ),
        "validation_period": _length(
            cfg.get("min_validation_period", {"batches": 0}), "min_validation_period", gbs
        ),
        "reporting_period": Batch(_int(cfg.get("scheduling_unit", 100), "scheduling_unit", 1)),
        "checkpoint_policy": policy,
        "latest_checkpoint": latest_checkpoint or info_latest_checkpoint or "latest",
        "step_zero_validation": _bool(
            cfg.get("perform_initial_validation", False), "perform_initial_validation"
        ),
        "test_mode": False,
        # absent: the Trainer's default (on); an explicit false turns it off
        "profiling_enabled": _bool(
            _section(cfg, "profiling").get("enabled", True), "profiling.enabled"
        ),
    }
    max_length = _section(cfg, "searcher").get("max_length")
    if max_length is not None:
        fit["max_length"] = _length(max_length, "searcher.max_length", gbs)
    plan.fit_kwargs = fit
    return plan
