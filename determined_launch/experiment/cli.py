"""``det-launch experiment``: run a search, work for one, or show its status.

    det-launch experiment CONFIG.yaml [OPTIONS] {torch,horovod,deepspeed,exec} [OVERRIDES --] SCRIPT
    det-launch experiment CONFIG.yaml [OPTIONS]          (runs the config's entrypoint)
    det-launch experiment CONFIG.yaml --worker [OPTIONS] ... (one trial at a time, shared study)
    det-launch experiment --status DIR|NAME|ID

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
from typing import Any

from determined_launch import values
from determined_launch.errors import EXIT_USAGE, LaunchError, UsageParser
from determined_launch.experiment.command import BACKENDS
from determined_launch.launch import config, usage
from determined_launch.launch.config import Option

OPTIONS: tuple[Option, ...] = (
    Option("experiment_dir", "DET_EXPERIMENT_DIR", "--experiment-dir", str, None,
           "the experiment's directory (default <root>/<name>; the experiments root is "
           "DET_EXPERIMENTS_DIR or ./det_experiments)", metavar="DIR"),
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




def parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="det-launch experiment",
                usage="det-launch experiment CONFIG.yaml [OPTIONS] "
                      "[{torch,horovod,deepspeed,exec} [OVERRIDES... --] SCRIPT...]\n"
                      "       det-launch experiment --status DIR|NAME|ID",
                description="Determined's hyperparameter search (hyperparameters + searcher "
                            "blocks) on Optuna; each trial is a launcher job.")
    config.add_flags(p)
    config.add_flags(p, OPTIONS)
    p.add_argument("--status", metavar="DIR|NAME|ID", help="print the table and best trial "
                   "of the experiment in DIR, or of that name or id in the experiments root "
                   "(DET_EXPERIMENTS_DIR, default ./det_experiments), then exit")
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
    """The experiment's own options, by the launcher's rules (flag, else variable)."""
    flags = {o.name: getattr(ns, o.name) for o in OPTIONS}
    return config.resolve(os.environ, flags, OPTIONS)


def status_dir(ref: str) -> pathlib.Path:
    """``--status``'s directory: REF itself, else the experiment of that name or id
    in the experiments root (``DET_EXPERIMENTS_DIR``, ``./det_experiments``)."""
    path = pathlib.Path(ref)
    if (path / "experiment.json").is_file():
        return path
    from determined_launch.exproot import LookupFailed, Root, root_dir

    try:
        return Root(root_dir()).experiment(ref).dir
    except LookupFailed as e:
        if path.is_dir():
            return path  # status() names what this directory lacks
        raise LaunchError(f"--status {ref}: not an experiment directory, and {e}") from None


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

            return status(status_dir(ns.status), resolve(ns)["study_storage"])
        if ns.checkpoint_storage:
            raise LaunchError("--checkpoint-storage: det-launch experiment saves every trial's "
                              "checkpoints to its config's checkpoint_storage")
        if not ns.config_path:
            raise LaunchError("no experiment config given (det-launch experiment CONFIG.yaml "
                              "...)")
        if command and command[0] in BACKENDS and usage.wants_help(command[1:]):
            print(usage.subcommand_help(command[0]), end="")  # not --help in every trial
            return 0
        if command and command[0] not in BACKENDS:
            raise LaunchError(f"unknown command {command[0]!r} after the config (expected one "
                              f"of {', '.join(BACKENDS)}, or nothing to run the entrypoint)")
        from determined_launch.experiment.run import run_experiment

        return run_experiment(ns, resolve(ns), command)
    except LaunchError as e:
        print(f"det-launch: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
