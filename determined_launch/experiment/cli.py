"""``det-launch experiment``: run a search, work for one, or show its status.

    det-launch experiment CONFIG.yaml [OPTIONS] {torch,horovod,deepspeed,exec} [OVERRIDES --] SCRIPT
    det-launch experiment CONFIG.yaml [OPTIONS]          (runs the config's entrypoint)
    det-launch experiment CONFIG.yaml --worker [OPTIONS] ... (one trial at a time, shared study)
    det-launch experiment --status DIR

OPTIONS are the launcher's (they apply to every trial) plus the experiment's
own, declared in ``OPTIONS`` below with their environment variables.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from determined_launch import config, values
from determined_launch.config import Option
from determined_launch.errors import EXIT_USAGE, LaunchError

BACKENDS = ("torch", "horovod", "deepspeed", "exec")
#: Launcher options that make up one run's trial identity; the experiment sets
#: every trial's, so they are refused here and kept from the trials.
TRIAL_IDENTITY = ("hparams", "config", "fresh")
#: Determined's launch modules in an entrypoint -> our subcommand
ENTRYPOINT_MODULES = {
    "determined.launch.torch_distributed": "torch",
    "determined.launch.horovod": "horovod",
    "determined.launch.deepspeed": "deepspeed",
    "determined_launch.torch_distributed": "torch",
    "determined_launch.horovod": "horovod",
    "determined_launch.deepspeed": "deepspeed",
}

OPTIONS: tuple[Option, ...] = (
    Option("experiment_dir", "DET_EXPERIMENT_DIR", "--experiment-dir", str, None,
           "the experiment's directory (default ./det_experiments/<name>)", metavar="DIR"),
    Option("study_storage", "DET_STUDY_STORAGE", "--study-storage", str, None,
           "Optuna study storage: a journal file path or an RDB URL (postgresql://...); "
           "default <experiment dir>/study.journal", metavar="URL"),
    Option("worker", "DET_EXPERIMENT_WORKER", "--worker", values.boolean, False,
           "run one trial at a time from a shared study (SLURM arrays, k8s indexed Jobs)",
           switch=True),
    Option("max_concurrent", "DET_EXPERIMENT_CONCURRENCY", "--max-concurrent-trials",
           functools.partial(values.integer, minimum=1, maximum=4096), None,
           "trials this process runs at once (default: searcher.max_concurrent_trials, "
           "1 with --worker)", metavar="N"),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"det-launch experiment: error: {message} (see det-launch experiment --help)",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="det-launch experiment",
                usage="det-launch experiment CONFIG.yaml [OPTIONS] "
                      "[{torch,horovod,deepspeed,exec} [OVERRIDES... --] SCRIPT...]\n"
                      "       det-launch experiment --status DIR",
                description="Determined's hyperparameter search (hyperparameters + searcher "
                            "blocks) on Optuna; each trial is a launcher job.")
    p.add_argument("--detector", help="use only this detector")
    p.add_argument("--disable-detector", action="append", default=[], metavar="NAME")
    config.add_flags(p)
    for o in OPTIONS:
        text = f"{o.help} ({o.env})"
        assert o.flag is not None  # noqa: S101 (every experiment option has one)
        if o.switch:
            p.add_argument(o.flag, dest=o.name, action="store_true", help=text)
        else:
            p.add_argument(o.flag, dest=o.name, metavar=o.metavar, help=text)
    p.add_argument("--status", metavar="DIR", help="print the table and best trial of the "
                   "experiment in DIR, then exit")
    p.add_argument("config_path", nargs="?", metavar="CONFIG.yaml",
                   help="Determined experiment config (YAML)")
    return p


def split_argv(p: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Our part (options and CONFIG) and the trial command (``torch ...``):
    the command starts at the second positional word, and everything after
    it belongs to the backend, as for ``det-launch torch``."""
    takes_value = {s for a in p._actions for s in a.option_strings if a.nargs != 0}
    positional = 0
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("-") and word != "-":
            i += 2 if word in takes_value and "=" not in word else 1
            continue
        positional += 1
        if positional == 2:
            return list(argv[:i]), list(argv[i:])
        i += 1
    return list(argv), []


def resolve(ns: argparse.Namespace) -> dict[str, Any]:
    flags = {o.name: getattr(ns, o.name) for o in OPTIONS}
    out: dict[str, Any] = {}
    for o in OPTIONS:
        value = o.default
        raw = os.environ.get(o.env or "")
        if raw is not None and raw.strip():
            value = _parse(o, raw, f"environment variable {o.env}")
        given = flags.get(o.name)
        if given is not None and given is not False:
            value = True if o.switch else _parse(o, given, o.flag or o.name)
        out[o.name] = value
    return out


def _parse(o: Option, raw: str, where: str) -> Any:
    try:
        return o.parse(raw)
    except ValueError as e:
        raise LaunchError(f"{where}: {e}") from None


def trial_flags(ns: argparse.Namespace) -> list[str]:
    """The launcher flags given on our command line, for every trial's launcher.
    ``--slots`` went into the driver's detection and ``--preempt-file`` is
    the driver's own (it preempts every trial), so neither is passed on."""
    out: list[str] = []
    for o in config.OPTIONS:
        if o.flag is None or o.name in ("slots", "preempt_file", *TRIAL_IDENTITY):
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


def trial_identity_env() -> tuple[str, ...]:
    """Variables of those options, removed from the trials' environment."""
    return tuple(o.env for o in config.OPTIONS if o.name in TRIAL_IDENTITY and o.env)


def entrypoint_command(words: Sequence[str], where: str) -> tuple[str, list[str]]:
    """A Determined ``entrypoint`` as our subcommand and its arguments:
    ``python3 -m determined.launch.torch_distributed ARGS`` is ``torch ARGS``;
    any other command runs once per node (``exec``)."""
    words = list(words)
    if len(words) >= 3 and os.path.basename(words[0]).startswith("python") and words[1] == "-m":
        sub = ENTRYPOINT_MODULES.get(words[2])
        if sub is not None:
            rest = words[3:]
            if not rest:
                raise LaunchError(f"{where}: entrypoint: {words[2]} without a script to run")
            return sub, rest
    if len(words) == 1 and ":" in words[0] and "/" not in words[0] and " " not in words[0]:
        raise LaunchError(f"{where}: entrypoint: {words[0]!r} is a Trial class (model_def:"
                          "Trial); det-launch experiment runs commands: use "
                          "'python3 -m determined.launch.torch_distributed python3 -m "
                          f"determined_launch.pytorch {words[0]}'")
    return "exec", ["--", *words]


def main(argv: Sequence[str]) -> int:
    p = parser()
    ours, command = split_argv(p, argv)
    try:
        ns = p.parse_args(ours)
    except SystemExit as e:
        return int(e.code or 0) and EXIT_USAGE
    try:
        if ns.status:
            from determined_launch.experiment.run import status

            return status(pathlib.Path(ns.status), resolve(ns)["study_storage"])
        if not ns.config_path:
            raise LaunchError("no experiment config given (det-launch experiment CONFIG.yaml "
                              "...)")
        if command and command[0] not in BACKENDS:
            raise LaunchError(f"unknown command {command[0]!r} after the config (expected one "
                              f"of {', '.join(BACKENDS)}, or nothing to run the entrypoint)")
        from determined_launch.experiment.run import run_experiment

        return run_experiment(ns, resolve(ns), command)
    except LaunchError as e:
        print(f"det-launch: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
