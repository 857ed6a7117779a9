"""``det-launch``: one command for every launcher, plus ``info``.

    det-launch [LAUNCHER OPTIONS] torch    [TORCH_OVERRIDES... --] SCRIPT...
    det-launch [LAUNCHER OPTIONS] horovod  [HVD_ARGS... --] SCRIPT...
    det-launch [LAUNCHER OPTIONS] deepspeed [DS_ARGS... --] SCRIPT...
    det-launch [LAUNCHER OPTIONS] exec -- CMD...      (CMD once per node)
    det-launch [--detector D] info
    det-launch checkpoints {list,gc} STORAGE [--remove]   (see storage_cli.py)
    det-launch experiment CONFIG.yaml [OPTIONS] [{torch,...} [OVERRIDES... --] SCRIPT...]
    det-launch ui [PATH ...] [--host HOST] [--port PORT]   (the WebUI; see ui/cli.py)

Determined's own ``det`` CLI (``det e create X.yaml . -f``...) is ``det/main.py``.

Launcher options come before the subcommand so they can never be confused
with the backend's own flags that follow it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Optional

from determined_launch.cluster.detect import detect
from determined_launch.cluster.local_trial import OWNER, complete
from determined_launch.core.storage import commit_check
from determined_launch.errors import EXIT_USAGE, LaunchError, UsageParser
from determined_launch.launch import config
from determined_launch.launch.launcher import (
    LauncherOptions,
    detection_env,
    main_for_backend,
    report_errors,
)
from determined_launch.launch.usage import HELP_WORDS

#: subcommand -> (module with ``build_plan``, name used in messages)
BACKENDS = {
    "torch": ("determined_launch.backends.torch_distributed", "torch_distributed"),
    "horovod": ("determined_launch.backends.horovod", "horovod"),
    "deepspeed": ("determined_launch.backends.deepspeed", "deepspeed"),
    "exec": ("determined_launch.backends.exec", "exec"),
}




#: every subcommand, for --help; the last two have their own parsers and come first
COMMANDS = {
    "torch": "launch torch.distributed workers (torchrun)",
    "horovod": "launch Horovod workers (horovodrun)",
    "deepspeed": "launch DeepSpeed workers",
    "exec": "run a command once per node",
    "info": "print the detected cluster and the trial the workers would get",
    "experiment": "a hyperparameter search from a Determined experiment config",
    "checkpoints": "list checkpoints, or find and remove leftovers (det-launch checkpoints -h)",
    "ui": "the web UI over experiments and runs (det-launch ui -h)",
}
OWN_PARSER = ("checkpoints", "ui")


def _parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="det-launch",
        usage="det-launch [LAUNCHER OPTIONS] COMMAND ...\n"
        "       det-launch [LAUNCHER OPTIONS] torch [TORCHRUN_OPTIONS... --] SCRIPT...\n"
        "       det-launch [LAUNCHER OPTIONS] exec -- CMD...",
        description="Determined's distributed launch layer for any cluster.\n\ncommands:\n"
        + "\n".join(f"  {name:<13}{what}" for name, what in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="det-launch COMMAND --help: a command's own usage.\n\nexamples:\n"
        "  det-launch --slots 2 torch -- python train.py --epochs 3\n"
        "  det-launch --dry-run torch -- python train.py     (print the plan, start nothing)\n"
        "  det-launch info                                   (what was detected)\n\n"
        "Exit status: 0 success; the first failing worker's status (128+N for signal "
        "N); 130/143 when interrupted by SIGINT/SIGTERM; 2 usage or configuration error; "
        "75 preempted after acknowledgement (resumable).",
    )
    p._optionals.title = "launcher options"
    p.add_argument("--version", action="version", version=f"det-launch {_version()}")
    config.add_flags(p)
    # listed in the description: argparse's own listing would only repeat it
    p.add_argument("command", choices=list(COMMANDS), help=argparse.SUPPRESS)
    p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def _version() -> str:
    import determined_launch

    return str(determined_launch.__version__)


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def first_mistake(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Optional[str]:
    """The launcher's own words (options, then the command), checked before argparse:
    its message for ``--slotz 2 torch`` is "invalid choice: '2'", and for a misspelt
    command it lists every choice without saying which was meant."""
    known = {s: a.nargs != 0 for a in parser._actions for s in a.option_strings}
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-") or word == "-":
            if word in COMMANDS:
                return None
            return f"unknown command {word!r}{_did_you_mean(word, list(COMMANDS))}"
        name = word.split("=", 1)[0]
        if name not in known:
            prefixed = [k for k in known if k.startswith(name) and name.startswith("--")]
            if len(prefixed) != 1:  # argparse takes a unique abbreviation
                return f"unknown launcher option {name}{_did_you_mean(name, list(known))}"
            name = prefixed[0]
        i += 2 if known[name] and "=" not in word else 1
    return None


def _options(ns: argparse.Namespace) -> LauncherOptions:
    return LauncherOptions.from_values(config.resolve(os.environ, config.flag_values(ns)))


def info_command(options: LauncherOptions) -> int:
    """Print what was detected and why earlier detectors did not match."""
    env = detection_env(options, os.environ)
    report = detect(env, force=options.detector, disable=options.disabled_detectors)
    # what the workers would get
    info = complete(report.info, env, options.local_trial,
                    is_committed=commit_check(env, report.info.checkpoint_storage),
                    command=OWNER)
    out = {
        "detector": report.info.source,
        "cluster_info": info.to_dict(),
        "skipped": [{"detector": name, "reason": why} for name, why in report.skipped],
    }
    print(json.dumps(out, indent=2))
    return 0


def _keep_separator(argv: Sequence[str], ns: argparse.Namespace) -> None:
    """argparse drops the ``--`` right after the subcommand; put it back, so
    that in ``exec -- CMD -- ARGS`` the first ``--`` ends our options and the
    second stays CMD's own (``python3 -m determined.launch.X -- script``)."""
    head = list(argv[: len(argv) - len(ns.args)])
    if head[-2:] == [ns.command, "--"]:
        ns.args = ["--", *ns.args]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["checkpoints"]:
        from determined_launch import storage_cli

        return storage_cli.main(argv[1:])
    if argv[:1] == ["ui"]:  # a reader beside the flow: its own parser, no cluster detection
        from determined_launch.ui.cli import main as ui_main

        return ui_main(argv[1:])
    parser = _parser()
    try:
        mistake = first_mistake(parser, argv)
        if mistake:
            parser.error(mistake)
        ns = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (already printed)
        return int(e.code or 0) and EXIT_USAGE
    _keep_separator(argv, ns)
    try:
        options = _options(ns)
    except LaunchError as e:
        print(f"det-launch: error: {e}", file=sys.stderr)
        return e.exit_status
    if ns.command in OWN_PARSER:  # reached only when options came first
        print(f"det-launch: error: launcher options do not apply to {ns.command}; use "
              f"det-launch {ns.command} ...", file=sys.stderr)
        return EXIT_USAGE
    if ns.command == "experiment":  # its own parser: options may follow CONFIG.yaml
        from determined_launch.experiment.cli import main as experiment_main

        return experiment_main([*argv[: argv.index("experiment")], *ns.args])
    if ns.command == "info":
        if ns.args:  # info takes nothing: say so rather than ignore it
            if ns.args[0] in HELP_WORDS:
                print("usage: det-launch [--detector NAME] [--slots N] ... info\n\nPrints the "
                      "detector that matched, the cluster info and trial the workers would "
                      "get (JSON), and why each earlier detector did not match.")
                return 0
            print(f"det-launch: error: info takes no arguments (got {' '.join(ns.args)}); "
                  "launcher options go before it", file=sys.stderr)
            return EXIT_USAGE
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
