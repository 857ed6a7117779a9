"""The command each trial's launcher runs: the launcher flags passed on from
``det-launch experiment``'s command line, and a Determined ``entrypoint``
mapped onto our subcommands. Shared by the command line (``cli.py``) and the
experiment runner (``run.py``), so neither imports the other's internals."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from determined_launch.errors import LaunchError
from determined_launch.launch import config

BACKENDS = ("torch", "horovod", "deepspeed", "exec")
#: Launcher options that make up one run's trial identity; the experiment sets
#: every trial's, so they are refused here and kept from the trials.
TRIAL_IDENTITY = ("hparams", "config", "fresh")
#: The driver restarts trials by the config's ``max_restarts``; a trial's launcher
#: restarting on its own as well would multiply the two (``--min-nodes`` is a kind
#: of restart, and needs ``--max-restarts``: a trial launcher given it fails).
DRIVER_OWNED = ("max_restarts", "min_nodes")
#: Determined's launch modules in an entrypoint -> our subcommand
ENTRYPOINT_MODULES = {
    "determined.launch.torch_distributed": "torch",
    "determined.launch.horovod": "horovod",
    "determined.launch.deepspeed": "deepspeed",
    "determined_launch.torch_distributed": "torch",
    "determined_launch.horovod": "horovod",
    "determined_launch.deepspeed": "deepspeed",
}


def trial_flags(ns: argparse.Namespace) -> list[str]:
    """The launcher flags given on our command line, for every trial's launcher.
    ``--slots`` went into the driver's detection and ``--preempt-file`` is
    the driver's own (it preempts every trial), so neither is passed on."""
    out: list[str] = []
    for o in config.OPTIONS:
        if o.flag is None or o.name in ("slots", "preempt_file", *TRIAL_IDENTITY,
                                        *DRIVER_OWNED):
            continue
        value = getattr(ns, o.name, None)
        if o.switch and value:
            out.append(o.flag)
        elif not o.switch and value is not None:
            out += [o.flag, value]
    return out


def refuse_trial_identity(ns: argparse.Namespace) -> None:
    for o in config.OPTIONS:
        if o.name in TRIAL_IDENTITY and getattr(ns, o.name, None) not in (None, False):
            raise LaunchError(f"{o.flag} sets one run's trial; det-launch experiment sets each "
                              "trial's hparams and checkpoint itself")
        if o.name in DRIVER_OWNED and getattr(ns, o.name, None) is not None:
            raise LaunchError(f"{o.flag} restarts one job; det-launch experiment restarts each "
                              "trial by its config's max_restarts (a multi-node trial on all "
                              "of its nodes)")


def trial_identity_env() -> tuple[str, ...]:
    """Variables of those options, removed from the trials' environment."""
    return tuple(o.env for o in config.OPTIONS
                 if o.name in (*TRIAL_IDENTITY, *DRIVER_OWNED) and o.env)


#: Fields the legacy runner reads (a ``model_def:Class`` entrypoint), which are
#: Determined-only for any other command
RUNNER_FIELDS = ("data", "min_validation_period", "min_checkpoint_period", "scheduling_unit",
                 "optimizations", "profiling", "checkpoint_policy", "perform_initial_validation")
RUNNER_MODULE = "determined_launch.pytorch"


def unused_fields(ignored: Sequence[str], args: Sequence[str]) -> tuple[str, ...]:
    """The config's Determined-only fields, less what the trials' command reads."""
    if RUNNER_MODULE not in args:
        return tuple(ignored)
    return tuple(f for f in ignored if f not in RUNNER_FIELDS)


def entrypoint_command(words: Sequence[str], where: str) -> tuple[str, list[str]]:
    """A Determined ``entrypoint`` (of the config file ``where``) as our
    subcommand and its arguments: ``python3 -m determined.launch.torch_distributed
    ARGS`` is ``torch ARGS``; ``model_def:Class`` runs the legacy runner with the
    config (``torch -- python -m determined_launch.pytorch --config WHERE
    model_def:Class``); any other command runs once per node (``exec``)."""
    words = _our_python(words)
    if len(words) >= 3 and os.path.basename(words[0]).startswith("python") and words[1] == "-m":
        sub = ENTRYPOINT_MODULES.get(words[2])
        if sub is not None:
            rest = _our_python(words[3:])
            if not rest:
                raise LaunchError(f"{where}: entrypoint: {words[2]} without a script to run")
            return sub, rest
    if len(words) == 1 and ":" in words[0] and "/" not in words[0] and " " not in words[0]:
        # A legacy Trial class, as Determined runs it: the legacy runner under torch (one
        # rank per slot), with the experiment's own config for everything but the hparams
        # (those come with the trial's cluster info).
        return "torch", ["--", sys.executable, "-m", RUNNER_MODULE, "--config",
                         os.path.abspath(where), words[0]]
    return "exec", ["--", *words]


def _our_python(words: Sequence[str]) -> list[str]:
    """A bare ``python``/``python3`` is the Python running det-launch: Determined's
    container had one, and here a venv's det-launch started by its path (without
    activating the venv) would otherwise run the trial in another environment."""
    words = list(words)
    if words and words[0] in ("python", "python3"):
        words[0] = sys.executable
    return words
