"""``det``'s command line: Determined 0.38.1's nouns, verbs, abbreviations and
flags (``e|xperiment``: ``e`` or ``experiment``; ``list ls``; ``list-trials lt``...),
for what runs here without a master. Exit status: 0 success; 1 a failed
``wait``/``--test`` or an unknown experiment, trial or checkpoint; 2 a usage or
config error."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from determined_launch.det import commands as c
from determined_launch.errors import EXIT_USAGE, LaunchError, UsageParser
from determined_launch.exproot import ENV, LookupFailed, Root, root_dir

Handler = Callable[[argparse.Namespace, Root], int]


def _aliases(spec: str) -> tuple[str, list[str]]:
    """Determined's spelling: ``"e|xperiment"`` -> ``experiment``, aliases ``["e"]``;
    each further word is an alias too (``"list ls"``)."""
    names = []
    for word in spec.split():
        parts = word.split("|")
        names += ["".join(parts[: i + 1]) for i in range(len(parts))]
    main = "".join(spec.split()[0].split("|"))
    return main, [n for n in names if n != main]


def _cmd(sub: Any, spec: str, handler: Optional[Handler], help_text: str
         ) -> argparse.ArgumentParser:
    name, aliases = _aliases(spec)
    p = sub.add_parser(name, aliases=aliases, help=help_text, description=help_text)
    p.set_defaults(handler=handler, parser=p)
    return p


def _csv(p: argparse.ArgumentParser) -> None:
    p.add_argument("--csv", action="store_true", help="print as CSV")


def _create_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config_file", help="experiment config file (.yaml)")
    p.add_argument("model_def", nargs="?", default=None,
                   help="directory with the model definition (copied into the experiment)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="set a config field (nested keys with dots: resources.slots_per_trial=2;"
                        " a,b for a list; JSON/YAML for anything else)")


def _experiment(sub: Any) -> None:
    e = _cmd(sub, "e|xperiment", None, "manage experiments")
    verbs = e.add_subparsers(dest="verb", metavar="VERB")
    p = _cmd(verbs, "list ls", c.list_experiments, "list experiments")
    p.add_argument("--all", "-a", action="store_true", help="(every experiment is listed)")
    _csv(p)
    e.set_defaults(handler=c.list_experiments, csv=False, all=False)
    p = _cmd(verbs, "config", c.config, "display experiment config")
    p.add_argument("experiment_id", help="experiment ID or name")
    p = _cmd(verbs, "describe", c.describe, "describe experiment")
    p.add_argument("experiment_ids", help="comma-separated list of experiment IDs (or names)")
    p.add_argument("--metrics", action="store_true", help="(metrics are in the trials' files)")
    _csv_or_json(p)
    p = _cmd(verbs, "logs", c.experiment_logs, "fetch logs of the first trial of an experiment")
    p.add_argument("experiment_id", help="experiment ID or name")
    _log_args(p)
    for spec, handler, what in (("list-trials lt", c.list_trials, "list trials of experiment"),
                                ("list-checkpoints lc", c.list_checkpoints,
                                 "list checkpoints of experiment")):
        p = _cmd(verbs, spec, handler, what)
        p.add_argument("experiment_id", help="experiment ID or name")
        if handler is c.list_checkpoints:
            p.add_argument("--best", type=int, metavar="N",
                           help="the best N checkpoints by the searcher metric")
        _csv(p)
    p = _cmd(verbs, "create", c.create, "create experiment")
    _create_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("-f", "--follow-first-trial", action="store_true",
                   help="follow the logs of the first trial that is created")
    g.add_argument("--paused", action="store_true", help="do not activate the experiment")
    g.add_argument("-t", "--test-mode", action="store_true",
                   help="run one small trial (one batch, no restarts) and say whether it worked")
    p.add_argument("--print-k8s", action="store_true",
                   help="write a Kubernetes indexed Job for the experiment's workers instead "
                        "of running it (docs/cli.md)")
    p.add_argument("--slurm", nargs=argparse.REMAINDER, metavar="SBATCH_ARGS",
                   help="submit the experiment as a SLURM job array of workers; the rest of "
                        "the line goes to sbatch")
    for spec, handler, what in (("activate unpause", c.activate, "activate experiment"),
                                ("pause", c.pause, "pause experiment"),
                                ("cancel", c.cancel, "cancel experiment"),
                                ("kill", c.kill, "kill experiment"),
                                ("wait", c.wait, "wait for experiment to reach terminal state")):
        p = _cmd(verbs, spec, handler, what)
        p.add_argument("experiment_id", help="experiment ID or name")
        if handler is c.wait:
            p.add_argument("--polling-interval", type=float, default=5,
                           help="the interval (in seconds) to poll for updated state")


def _csv_or_json(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--csv", action="store_true", help="print as CSV")
    g.add_argument("--json", action="store_true", help="print as JSON")


def _log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--follow", action="store_true",
                   help="follow the logs of a running trial, similar to tail -f")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--head", type=int, help="number of lines to show from the beginning")
    g.add_argument("--tail", type=int, help="number of lines to show from the end")


def _trial(sub: Any) -> None:
    t = _cmd(sub, "t|rial", None, "manage trials")
    verbs = t.add_subparsers(dest="verb", metavar="VERB")
    p = _cmd(verbs, "describe", c.trial_describe, "describe trial")
    p.add_argument("trial_id", help="trial ID (or EXPERIMENT/TRIAL)")
    _csv_or_json(p)
    p = _cmd(verbs, "logs", c.trial_logs, "fetch trial logs")
    p.add_argument("trial_id", help="trial ID (or EXPERIMENT/TRIAL)")
    _log_args(p)


def _checkpoint(sub: Any) -> None:
    ck = _cmd(sub, "c|heckpoint", None, "manage checkpoints")
    verbs = ck.add_subparsers(dest="verb", metavar="VERB")
    p = _cmd(verbs, "list ls", c.list_checkpoints, "list checkpoints of an experiment")
    p.add_argument("experiment_id", help="experiment ID or name")
    p.add_argument("--best", type=int, metavar="N", help="the best N by the searcher metric")
    _csv(p)
    p = _cmd(verbs, "download", c.download_checkpoint,
             "download checkpoint from persistent storage")
    p.add_argument("uuid", help="the checkpoint's UUID")
    p.add_argument("-o", "--output-dir", help="output directory (default checkpoints/UUID)")
    p.add_argument("-q", "--quiet", action="store_true", help="only print the path")


def _job(sub: Any) -> None:
    j = _cmd(sub, "j|ob", None, "manage jobs")
    verbs = j.add_subparsers(dest="verb", metavar="VERB")
    p = _cmd(verbs, "run", c.job_run, "run a non-training job (its config's data: is "
                                       "context.config_data) and wait for it")
    _create_args(p)
    p = _cmd(verbs, "list ls", c.list_experiments, "list experiments (the jobs here)")
    _csv(p)
    j.set_defaults(handler=c.list_experiments, csv=False)


def parser() -> argparse.ArgumentParser:
    import determined_launch

    p = UsageParser(prog="det", description="Determined's command-line client, without a "
                    "master: experiments, trials and checkpoints in the experiments root "
                    f"(--experiments-dir, {ENV}, default ./det_experiments). docs/cli.md",
                    epilog="Exit status: 0 success; 1 a failed wait/--test or an unknown "
                           "experiment, trial or checkpoint; 2 a usage or config error.")
    p.add_argument("-m", "--master", help="ignored: this det runs without a master")
    p.add_argument("-u", "--user", help="ignored: this det runs without a master")
    p.add_argument("-v", "--version", action="version",
                   version=f"det (determined_launch) {determined_launch.__version__}")
    p.add_argument("--experiments-dir", metavar="DIR",
                   help=f"the experiments root (default {ENV}, else ./det_experiments)")
    sub = p.add_subparsers(dest="noun", metavar="COMMAND")
    _experiment(sub)
    _trial(sub)
    _checkpoint(sub)
    _job(sub)
    _cmd(sub, "version", c.version, "show version information")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    try:
        ns = p.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (already printed)
        return int(e.code or 0) and EXIT_USAGE
    root = Root(root_dir(ns.experiments_dir))
    if os.environ.get("DET_MASTER") or ns.master:
        print(f"det: {'DET_MASTER' if os.environ.get('DET_MASTER') else '--master'} is set, "
              "but this det (determined_launch) runs without a master: it works on the "
              f"experiments root {root.path}", file=sys.stderr)
    handler = getattr(ns, "handler", None)
    if handler is None:
        (getattr(ns, "parser", None) or p).print_help()
        return 0 if not ns.noun else EXIT_USAGE
    try:
        return int(handler(ns, root))
    except LookupFailed as e:
        print(f"det: error: {e.args[0]}", file=sys.stderr)
        return 1
    except LaunchError as e:
        print(f"det: error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
