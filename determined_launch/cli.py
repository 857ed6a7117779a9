"""``det-launch``: one command for every launcher, plus ``info``.

    det-launch [LAUNCHER OPTIONS] torch    [TORCH_OVERRIDES... --] SCRIPT...
    det-launch [LAUNCHER OPTIONS] horovod  [HVD_ARGS... --] SCRIPT...
    det-launch [LAUNCHER OPTIONS] deepspeed [DS_ARGS... --] SCRIPT...
    det-launch [--detector D] info

Launcher options come before the subcommand so they can never be confused
with the backend's own flags that follow it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Optional

from determined_launch.cluster.detect import detect, detector_names
from determined_launch.errors import EXIT_USAGE, LaunchError
from determined_launch.launcher import (
    LauncherOptions,
    main_for_backend,
    parse_signals,
    report_errors,
)

#: subcommand -> (module with ``build_plan``, name used in messages)
BACKENDS = {
    "torch": ("determined_launch.backends.torch_distributed", "torch_distributed"),
    "horovod": ("determined_launch.backends.horovod", "horovod"),
    "deepspeed": ("determined_launch.backends.deepspeed", "deepspeed"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="det-launch",
        description="Determined's distributed launch layer for any cluster.",
        epilog="Exit status: 0 success; the first failing worker's status (128+N for signal "
        "N); 2 usage or configuration error; 75 preempted after acknowledgement (resumable).",
    )
    p.add_argument("--detector", help=f"use only this detector ({', '.join(detector_names())})")
    p.add_argument(
        "--disable-detector", action="append", default=[], metavar="NAME", help="skip a detector"
    )
    p.add_argument("--slots", type=int, help="slots on this node for the local detector")
    p.add_argument("--preempt-grace", type=float, metavar="SECS",
                   help="seconds workers get to checkpoint after a preemption request")
    p.add_argument("--preempt-signals", metavar="SIGS",
                   help="signals that request preemption, e.g. TERM,USR1 or USR1@90")
    p.add_argument("--kill-after", type=float, metavar="SECS",
                   help="seconds between TERM and KILL when stopping workers")
    p.add_argument("--preempt-file", metavar="PATH",
                   help="preempt when this file appears (DET_PREEMPT_FILE)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    p.add_argument("--requeue", action="store_true",
                   help="after an acknowledged preemption, `scontrol requeue` the SLURM job")
    p.add_argument("command", choices=[*BACKENDS, "info"])
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def _options(ns: argparse.Namespace) -> LauncherOptions:
    base = LauncherOptions.from_env(os.environ)
    sup = base.supervisor
    if ns.preempt_grace is not None:
        sup = dataclasses.replace(sup, preempt_grace=ns.preempt_grace)
    if ns.kill_after is not None:
        sup = dataclasses.replace(sup, kill_after=ns.kill_after)
    if ns.preempt_signals is not None:
        sup = dataclasses.replace(
            sup,
            preempt_signals=parse_signals(ns.preempt_signals, "--preempt-signals", ()),
        )
    if ns.preempt_file is not None:
        sup = dataclasses.replace(sup, preempt_file=ns.preempt_file)
    return dataclasses.replace(
        base,
        detector=ns.detector,
        disabled_detectors=tuple(ns.disable_detector),
        supervisor=sup,
        dry_run=ns.dry_run or base.dry_run,
        requeue=ns.requeue or base.requeue,
    )


def info_command(options: LauncherOptions) -> int:
    """Print what was detected and why earlier detectors did not match."""
    report = detect(force=options.detector, disable=options.disabled_detectors)
    out = {
        "detector": report.info.source,
        "cluster_info": report.info.to_dict(),
        "skipped": [{"detector": name, "reason": why} for name, why in report.skipped],
    }
    print(json.dumps(out, indent=2))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and EXIT_USAGE
    if ns.slots is not None:
        if ns.slots < 1:
            print("det-launch: error: --slots must be >= 1", file=sys.stderr)
            return EXIT_USAGE
        os.environ["DET_LAUNCH_SLOTS"] = str(ns.slots)
    try:
        options = _options(ns)
    except LaunchError as e:
        print(f"det-launch: error: {e}", file=sys.stderr)
        return e.exit_status
    if ns.command == "info":
        return report_errors(lambda: info_command(options))
    module_name, backend = BACKENDS[ns.command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        print(f"det-launch: error: backend {ns.command!r} is unavailable: {e}", file=sys.stderr)
        return EXIT_USAGE
    return main_for_backend(backend, module.build_plan, ns.args, options)


if __name__ == "__main__":
    sys.exit(main())
