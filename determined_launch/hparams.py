"""Determined's ``hyperparameters`` block, parsed into typed specs.

The block is a mapping of names to either a typed spec (``{type: const|int|
double|log|categorical, ...}``), a nested mapping without ``type`` (a group of
hyperparameters, handed to the trial as a nested dict), or a plain value
(a constant, as Determined treats it). Parsing checks everything a searcher
will rely on up front, so a typo fails the experiment before any trial starts,
with one line naming the field (``hyperparameters.lr: minval 0.1 > maxval
0.01``).

This module is pure and standard-library only: ``det-launch --config`` (one
off-cluster trial) uses :func:`parse_hyperparameters` and :func:`constants`
without the search extra installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Union

from determined_launch.errors import LaunchError

TYPES = ("const", "int", "double", "log", "categorical")
# Determined's default base for ``log`` (minval/maxval are exponents of it).
DEFAULT_LOG_BASE = 10.0


class HParamError(LaunchError):
    """A hyperparameter spec a user must fix; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotConstantError(HParamError):
    """A range where a single value is needed (one trial, no searcher)."""


@dataclass(frozen=True)
class Const:
    val: Any


@dataclass(frozen=True)
class Int:
    minval: int
    maxval: int
    count: Union[int, None] = None


@dataclass(frozen=True)
class Double:
    minval: float
    maxval: float
    count: Union[int, None] = None


@dataclass(frozen=True)
class Log:
    """``base ** x`` for ``x`` in ``[minval, maxval]`` (exponents, as in Determined)."""

    minval: float
    maxval: float
    base: float = DEFAULT_LOG_BASE
    count: Union[int, None] = None


@dataclass(frozen=True)
class Categorical:
    vals: tuple[Any, ...]


Spec = Union[Const, Int, Double, Log, Categorical]
#: name -> spec, or name -> nested space (a group handed to the trial as a dict)
Space = dict[str, Union[Spec, "Space"]]

_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    # type -> (required fields, optional fields), besides "type"
    "const": ({"val"}, set()),
    "int": ({"minval", "maxval"}, {"count"}),
    "double": ({"minval", "maxval"}, {"count"}),
    "log": ({"minval", "maxval"}, {"base", "count"}),
    "categorical": ({"vals"}, set()),
}


def parse_hyperparameters(raw: object, field: str = "hyperparameters") -> Space:
    """The block as a :data:`Space`; ``None`` (no block) is an empty space."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise HParamError(field, f"expected a mapping of names to specs, got {_kind(raw)}")
    space: Space = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name:
            raise HParamError(field, f"hyperparameter names must be non-empty strings, "
                                     f"got {name!r}")
        sub = f"{field}.{name}"
        if isinstance(value, Mapping) and "type" not in value:
            space[name] = parse_hyperparameters(value, sub)
        elif isinstance(value, Mapping):
            space[name] = parse_spec(value, sub)
        else:
            space[name] = Const(value)  # a plain value is a constant, as in Determined
    return space


def parse_spec(raw: Mapping[str, Any], field: str) -> Spec:
    """One typed spec (a mapping with ``type``)."""
    kind = raw["type"]
    if kind not in TYPES:
        raise HParamError(f"{field}.type", f"unknown type {kind!r} "
                                           f"(expected one of {', '.join(TYPES)})")
    required, optional = _FIELDS[kind]
    unknown = sorted(str(k) for k in raw if k != "type" and k not in required | optional)
    if unknown:
        raise HParamError(field, f"unknown field(s) {', '.join(unknown)} for type {kind}")
    missing = sorted(required - set(raw))
    if missing:
        raise HParamError(field, f"missing {', '.join(missing)} for type {kind}")
    count = _count(raw.get("count"), f"{field}.count")
    if kind == "const":
        return Const(raw["val"])
    if kind == "categorical":
        vals = raw["vals"]
        if not isinstance(vals, list) or not vals:
            raise HParamError(f"{field}.vals", f"expected a non-empty list, got {_kind(vals)}")
        return Categorical(tuple(vals))
    if kind == "int":
        lo = _number(raw["minval"], f"{field}.minval", integer=True)
        hi = _number(raw["maxval"], f"{field}.maxval", integer=True)
        _ordered(lo, hi, field)
        return Int(int(lo), int(hi), count)
    lo = _number(raw["minval"], f"{field}.minval")
    hi = _number(raw["maxval"], f"{field}.maxval")
    _ordered(lo, hi, field)
    if kind == "double":
        return Double(float(lo), float(hi), count)
    base = _number(raw.get("base", DEFAULT_LOG_BASE), f"{field}.base")
    if base <= 0 or base == 1:
        raise HParamError(f"{field}.base", f"expected a positive number other than 1, got {base}")
    return Log(float(lo), float(hi), float(base), count)


def leaves(space: Space, prefix: str = "") -> Iterator[tuple[str, Spec]]:
    """Every spec with its dotted path (``optimizer.lr``), in the block's order."""
    for name, node in space.items():
        path = f"{prefix}{name}"
        if isinstance(node, dict):
            yield from leaves(node, path + ".")
        else:
            yield path, node


def constants(space: Space, field: str = "hyperparameters") -> dict[str, Any]:
    """The hparams dict when every leaf is a constant (one trial, no search).

    Raises :class:`NotConstantError` naming the first leaf that is a range or
    a choice: there is no single value to hand the trial.
    """
    for path, spec in leaves(space):
        if not isinstance(spec, Const):
            kind = "a categorical choice" if isinstance(spec, Categorical) else (
                f"a{'n' if isinstance(spec, Int) else ''} {type(spec).__name__.lower()} range")
            raise NotConstantError(f"{field}.{path}",
                                   f"is {kind}, not a constant value "
                                   "(search it with det-launch experiment)")
    return build(space, {})


def build(space: Space, values: Mapping[str, Any]) -> dict[str, Any]:
    """The nested hparams dict a trial sees: constants filled in, every other
    leaf taken from ``values`` by its dotted path."""
    return _build(space, values, "")


def _build(space: Space, values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, node in space.items():
        path = f"{prefix}{name}"
        if isinstance(node, dict):
            out[name] = _build(node, values, path + ".")
        elif isinstance(node, Const):
            out[name] = node.val
        else:
            out[name] = values[path]
    return out


def grid_values(spec: Spec, field: str = "hyperparameters") -> list[Any]:
    """The points a grid search visits for one spec, as Determined chooses them:
    ``count`` evenly spaced points with both ends included (one point: the
    middle), integers rounded and deduplicated, ``log`` spaced in exponents."""
    if isinstance(spec, Const):
        return [spec.val]
    if isinstance(spec, Categorical):
        return list(spec.vals)
    if spec.count is None:
        raise HParamError(field, "a grid search needs a count for this range")
    if isinstance(spec, Int):
        count = min(spec.count, spec.maxval - spec.minval + 1)
        points = _spaced(spec.minval, spec.maxval, count)
        return sorted({int(round(p)) for p in points})
    points = _spaced(spec.minval, spec.maxval, spec.count)
    if isinstance(spec, Log):
        return [spec.base ** p for p in points]
    return points


def _spaced(lo: float, hi: float, count: int) -> list[float]:
    if count == 1:
        return [(lo + hi) / 2]
    return [lo + (hi - lo) * i / (count - 1) for i in range(count)]


def _count(raw: object, field: str) -> Union[int, None]:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise HParamError(field, f"expected a positive integer, got {raw!r}")
    return raw


def _number(raw: object, field: str, integer: bool = False) -> float:
    if integer:
        ok = isinstance(raw, int) and not isinstance(raw, bool)
    else:
        ok = isinstance(raw, (int, float)) and not isinstance(raw, bool)
        ok = ok and math.isfinite(float(raw))  # type: ignore[arg-type]
    if not ok:
        what = "an integer" if integer else "a finite number"
        raise HParamError(field, f"expected {what}, got {raw!r}")
    return raw  # type: ignore[return-value]


def _ordered(lo: float, hi: float, field: str) -> None:
    if lo > hi:
        raise HParamError(field, f"minval {lo} > maxval {hi}")


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__
