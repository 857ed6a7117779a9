"""Every launcher option, declared once: flag, environment variable, parser,
default and help.

``det-launch`` builds its flags from this table; ``python -m
determined_launch.X`` (whose own arguments belong to the backend) reads the
same options from the environment. A flag wins over its variable. Every
value goes through the same parser (``values.py``) whichever way it came,
and a bad one stops the launcher with exit status 2 and one line naming the
flag or variable, before anything starts. Options read by the workers
(``DET_DIST_TIMEOUT``, ``DET_DIST_TRANSPORT``) are checked here too, so a
typo costs one line instead of a traceback from every rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from determined_launch import envvars, values
from determined_launch.cluster.detect import detector_names
from determined_launch.errors import LaunchError
from determined_launch.supervisor.config import DEFAULT_PREEMPT_SIGNALS

DETECTORS = tuple(detector_names())


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    env: Optional[str]
    flag: Optional[str]
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: Optional[str] = None
    #: a flag without a value (``--dry-run``); its variable takes a boolean
    switch: bool = False
    #: a flag that may repeat (``--disable-detector a --disable-detector b``): its values
    #: join with commas, as its variable lists them
    repeat: bool = False


OPTIONS: tuple[Option, ...] = (
    Option("detector", envvars.DETECTOR, "--detector",
           functools.partial(values.choice, choices=DETECTORS), None,
           f"use only this detector; it must match ({', '.join(DETECTORS)})", metavar="NAME"),
    Option("disabled_detectors", envvars.DISABLE_DETECTORS, "--disable-detector",
           functools.partial(values.names, choices=DETECTORS), (),
           "skip these detectors (comma-separated; the flag may repeat)", metavar="NAME",
           repeat=True),
    Option("slots", "DET_LAUNCH_SLOTS", "--slots",
           functools.partial(values.integer, minimum=1, maximum=values.MAX_SLOTS_PER_NODE),
           None, "worker slots on this node (local detector, and SLURM/PBS/LSF/K8s overrides)",
           metavar="N"),
    Option("preempt_grace", "DET_PREEMPT_GRACE", "--preempt-grace", values.seconds, 30.0,
           "seconds workers get to checkpoint and exit after a preemption request",
           metavar="SECS"),
    Option("kill_after", "DET_KILL_AFTER", "--kill-after", values.seconds, 10.0,
           "seconds between TERM and KILL when stopping workers", metavar="SECS"),
    Option("preempt_signals", "DET_PREEMPT_SIGNALS", "--preempt-signals", values.signals,
           DEFAULT_PREEMPT_SIGNALS,
           "signals that request preemption, e.g. TERM,USR1 or SLURM's USR1@90", metavar="SIGS"),
    Option("preempt_file", envvars.PREEMPT_FILE, "--preempt-file", str, None,
           "preempt when this file appears", metavar="PATH"),
    Option("connect_timeout", envvars.CONNECT_TIMEOUT, "--connect-timeout",
           functools.partial(values.seconds, positive=True), 300.0,
           "seconds the node launchers wait for each other", metavar="SECS"),
    Option("dry_run", "DET_LAUNCH_DRY_RUN", "--dry-run", values.boolean, False,
           "validate everything and print the plan; start nothing", switch=True),
    Option("requeue", "DET_LAUNCH_REQUEUE", "--requeue", values.boolean, False,
           "after an acknowledged preemption, `scontrol requeue` the SLURM job", switch=True),
    Option("verbose", "DET_LAUNCH_VERBOSE", "--verbose", values.boolean, False,
           "show torchrun's, deepspeed's and horovodrun's own output instead of logging it",
           switch=True),
    Option("no_output_log", "DET_LAUNCH_NO_OUTPUT_LOG", "--no-output-log", values.boolean, False,
           "do not keep what the job prints in the run directory's output.log (the chief keeps it "
           "there, for det-launch ui and det t logs)", switch=True),
    # The local trial (cluster/local_trial.py): checked when the launcher resolves it.
    Option("hparams", "DET_LAUNCH_HPARAMS", "--hparams", str, None,
           "the local trial's hyperparameters: a JSON object or a JSON/YAML file",
           metavar="JSON|FILE"),
    Option("config", "DET_LAUNCH_CONFIG", "--config", str, None,
           "the local trial's hyperparameters from this experiment config's constants",
           metavar="EXP.yaml"),
    Option("fresh", "DET_LAUNCH_FRESH", "--fresh", values.boolean, False,
           "start over: do not resume from the run directory's newest checkpoint", switch=True),
    Option("max_restarts", "DET_LAUNCH_MAX_RESTARTS", "--max-restarts",
           functools.partial(values.integer, minimum=0, maximum=1000), 0,
           "after a worker fails on any node, restart every node's workers from the newest "
           "committed checkpoint, at most N times (docs/elastic.md)", metavar="N"),
    Option("hang_timeout", "DET_LAUNCH_HANG_TIMEOUT", "--hang-timeout",
           functools.partial(values.seconds, positive=True), None,
           "a rank that made Core API progress and then none for SECS is hung: print its stack, "
           "stop the job (a failure: --max-restarts restarts it). Default: off (docs/elastic.md)",
           metavar="SECS"),
    Option("min_nodes", "DET_LAUNCH_MIN_NODES", "--min-nodes",
           functools.partial(values.integer, minimum=1, maximum=100_000), None,
           "after a node (the chief's included) is lost, continue on the others while at least "
           "K remain, each time using one of --max-restarts (default: every node is needed)",
           metavar="K"),
    Option("no_determined_compat", "DET_LAUNCH_NO_DETERMINED_COMPAT", "--no-determined-compat",
           values.boolean, False,
           "do not map `python3 -m determined.launch.X` in workers to ours", switch=True),
    # Read by the workers (DistributedContext); checked before they start.
    Option("dist_timeout", envvars.DIST_TIMEOUT, None,
           functools.partial(values.seconds, positive=True), None,
           "seconds one DistributedContext collective may take"),
    Option("dist_transport", envvars.DIST_TRANSPORT, None,
           functools.partial(values.choice, choices=("direct", "zmq")), None,
           "DistributedContext transport"),
    Option("alert_webhook", envvars.ALERT_WEBHOOK, None, values.http_url, None,
           "core_context.alert() also POSTs each alert to this URL"),
    # Read by every rank's core.init (core/storage/); the launcher checks it before any
    # worker starts and hands the flag to the workers.
    Option("checkpoint_storage", envvars.CHECKPOINT_STORAGE, "--checkpoint-storage", str, None,
           "where checkpoints go: a directory, a URL (s3://, gs://, az://) or a YAML file with "
           "a checkpoint_storage block; checked before any worker starts", metavar="STORAGE"),
    # Read by the chief's core.init (core/trackers/); the launcher hands the flag to workers.
    Option("report_to", envvars.REPORT_TO, "--report-to", values.trackers, (),
           "also report metrics to these experiment trackers: mlflow,wandb,tensorboard",
           metavar="TOOLS"),
)


def _parse(option: Option, raw: str, where: str) -> Any:
    try:
        return option.parse(raw)
    except ValueError as e:
        raise LaunchError(f"{where}: {e}") from None


def resolve(
    env: Mapping[str, str],
    flags: Optional[Mapping[str, Any]] = None,
    options: Sequence[Option] = OPTIONS,
) -> dict[str, Any]:
    """Each option's value: the flag's, else the variable's, else the default.
    ``options``: this table unless a subcommand declares its own (``det-launch
    experiment``), read by the same rules.

    A bad variable is an error even when a flag overrides it: it is a
    mistake waiting for the day the flag is dropped.
    """
    flags = flags or {}
    out: dict[str, Any] = {}
    for option in options:
        value = option.default
        raw_env = env.get(option.env) if option.env else None
        if raw_env is not None and raw_env.strip():
            value = _parse(option, raw_env, f"environment variable {option.env}")
        given = flags.get(option.name)
        if option.repeat and isinstance(given, list):
            given = ",".join(given) or None
        if given is not None and given is not False:
            value = True if option.switch else _parse(option, given, option.flag or option.name)
        out[option.name] = value
    return out


def add_flags(parser: argparse.ArgumentParser, options: Sequence[Option] = OPTIONS) -> None:
    """Declare the table's flags on ``det-launch``'s parser (values as strings:
    the table's parsers check them, so flag and variable give the same error)."""
    for option in options:
        if option.flag is None:
            continue
        help_text = f"{option.help} ({option.env})" if option.env else option.help
        dest = option.name
        if option.switch:
            parser.add_argument(option.flag, dest=dest, action="store_true", help=help_text)
        elif option.repeat:
            parser.add_argument(option.flag, dest=dest, action="append", metavar=option.metavar,
                                help=help_text)
        else:
            parser.add_argument(option.flag, dest=dest, metavar=option.metavar, help=help_text)


def flag_values(ns: argparse.Namespace) -> dict[str, Any]:
    return {o.name: getattr(ns, o.name, None) for o in OPTIONS if o.flag is not None}
