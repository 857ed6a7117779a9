"""Parsers for option values, shared by every layer that reads one.

One parser per kind of value, so a flag, its environment variable and the
worker-side library that reads the same variable can never disagree (they
did: ``DET_LAUNCH_DRY_RUN=off`` once meant "on"). Each raises ``ValueError``
with a message that names the accepted values; callers prefix where the
value came from.
"""

from __future__ import annotations

import math
import re
import signal
from typing import Any

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: Bounds on a job's shape: beyond them a typo, not a cluster.
MAX_SLOTS_PER_NODE = 4096
MAX_NODES = 65536


def boolean(raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"expected one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}, "
                     f"got {raw!r}")


def seconds(raw: str, *, positive: bool = False) -> float:
    """A finite, non-negative (or positive) number of seconds."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    bound = "> 0" if positive else ">= 0"
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"expected a finite number of seconds {bound}, got {raw!r}")
    return value


def integer(raw: str, *, minimum: int, maximum: int) -> int:
    text = raw.strip()
    if not re.fullmatch(r"[0-9]{1,12}", text) or not minimum <= int(text) <= maximum:
        raise ValueError(f"expected an integer from {minimum} to {maximum}, got {raw!r}")
    return int(text)


def signals(raw: str) -> tuple[int, ...]:
    """``"TERM,USR1"`` or SLURM's ``"USR1@90"`` (the ``@secs`` part is SLURM's
    lead time and means nothing to us) into signal numbers."""
    out: list[int] = []
    for item in raw.split(","):
        name = item.split("@", 1)[0].strip().upper()
        if not name:
            continue
        try:
            number = int(name) if name.isdigit() else int(
                signal.Signals[name if name.startswith("SIG") else "SIG" + name]
            )
            signal.Signals(number)
        except (KeyError, ValueError):
            raise ValueError(
                f"unknown signal {item.strip()!r} (use names like TERM, USR1, USR2, HUP)"
            ) from None
        if number in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"{item.strip()} cannot be caught, so it cannot request preemption")
        out.append(number)
    if not out:
        raise ValueError(f"expected a list of signals like TERM,USR1, got {raw!r}")
    return tuple(out)


#: Experiment trackers ``--report-to`` names (core/trackers/).
TRACKERS = ("mlflow", "wandb", "tensorboard")


def trackers(raw: str) -> tuple[str, ...]:
    """``"mlflow,wandb"`` into tracker names, each once, in the given order."""
    return names(raw.lower(), TRACKERS)


def names(raw: str, choices: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated list of ``choices``, each once, in the given order."""
    out: list[str] = []
    for item in raw.split(","):
        name = item.strip()
        if name and name not in out:
            out.append(choice(name, choices))
    return tuple(out)


def choice(raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
    return raw


def http_url(raw: str) -> str:
    """An ``http://`` or ``https://`` URL with a host (webhooks). Only its
    start is echoed in errors: such URLs usually carry a token."""
    import urllib.parse

    parsed = urllib.parse.urlsplit(raw.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"expected an http:// or https:// URL, got {raw[:12]!r}...")
    return raw.strip()


def yaml_document(text: str, where: str, install: str = "pip install pyyaml") -> Any:
    """One YAML document (JSON included), every failure one ``ValueError`` line
    naming ``where``: ``<where>: invalid YAML at line L column C: <problem>``.
    PyYAML is imported only here and only when needed (``install`` says how
    to get it, since each caller belongs to a different extra)."""
    try:
        import yaml
    except ImportError:
        raise ValueError(f"{where}: reading YAML needs PyYAML: {install}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{where}: invalid YAML{at}: {problem}") from None


def plain(value: Any) -> str:
    """A value as a person reads it: numpy and torch scalars as the plain number
    (``0.5``, not ``np.float64(0.5)``), floats to 6 significant digits, arrays
    as their shape, long values cut. numpy is never imported here: a value can
    only be a numpy one when numpy is already loaded."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0 and not isinstance(value, (int, float)):
        try:
            value = item()
        except (TypeError, ValueError, RuntimeError):
            pass
    elif isinstance(value, (int, float)) and type(value) not in (int, float, bool):
        value = float(value) if isinstance(value, float) else int(value)  # np.float64 -> float
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return str(value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} shape={tuple(shape)}>"
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def plain_metrics(metrics: Any) -> str:
    """``loss=0.743319 acc=0.9``: a metrics dict for a log line."""
    return " ".join(f"{k}={plain(v)}" for k, v in dict(metrics).items())
