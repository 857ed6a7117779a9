"""What a launcher says about its own command line before starting anything:
its help (``det-launch torch --help``, ``python -m determined_launch.horovod
--help``) and a launcher option put after the subcommand, where it would go
to torchrun & co. (``det-launch torch --slots 2 -- train.py``).

Only the words before ``--`` are the launcher's: ``det-launch torch -- python
train.py --help`` passes ``--help`` to the script. Without ``--``, every word
is the script's, except a first ``-h``/``--help``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from determined_launch.launch import config

HELP_WORDS = ("-h", "--help")

#: backend -> (det-launch subcommand, what goes before ``--``, what it starts, a note)
BACKENDS = {
    "torch_distributed": ("torch", "TORCHRUN_OPTIONS", "torchrun, one worker per slot",
                          "TORCHRUN_OPTIONS (torchrun --help) override ours."),
    "horovod": ("horovod", "HOROVODRUN_ARGS", "horovodrun, one worker per slot",
                "HOROVODRUN_ARGS also take --autohorovod and --ssh/--no-ssh (docs/backends.md)."),
    "deepspeed": ("deepspeed", "DEEPSPEED_ARGS", "the deepspeed launcher, one worker per slot",
                  "DEEPSPEED_ARGS go to deepspeed (--ssh/--no-ssh: docs/backends.md)."),
    "exec": ("exec", "", "CMD once (Determined's plain entrypoint, e.g. a custom launcher)",
             "CMD is not wrapped in wrap_rank: a launcher labels its own workers."),
}
#: backends with a ``python -m determined_launch.X`` module of Determined's name
MODULES = ("torch_distributed", "horovod", "deepspeed")

#: launcher flags that the framework launcher also has, so they are its own after the
#: subcommand (torchrun's --max-restarts, horovodrun's --verbose)
_SHARED = {"torch_distributed": ("--max-restarts",), "horovod": ("--verbose",)}


def launcher_words(argv: Sequence[str]) -> list[str]:
    """The words that belong to the launcher: those before ``--``."""
    argv = list(argv)
    return argv[: argv.index("--")] if "--" in argv else []


def wants_help(argv: Sequence[str]) -> bool:
    argv = list(argv)
    return bool(argv[:1] and argv[0] in HELP_WORDS) or any(
        w in HELP_WORDS for w in launcher_words(argv))


def backend_help(backend: str) -> str:
    sub, before, what, note = BACKENDS.get(backend, (backend, "OVERRIDES", backend, ""))
    script = "CMD" if sub == "exec" else "SCRIPT"
    head = f"[{before}... --] " if before else "-- "
    module = (f"       python -m determined_launch.{backend} {head}{script}...\n"
              if backend in MODULES else "")
    return (f"usage: det-launch [LAUNCHER OPTIONS] {sub} {head}{script}...\n{module}\n"
            f"On every node of the detected cluster (det-launch info), start {what}.\n{note}\n"
            f"Everything after '--' is {script} with its own arguments, as given "
            f"(det-launch {sub} -- python train.py --help asks train.py).\n"
            "LAUNCHER OPTIONS come before the subcommand; det-launch --help lists them"
            + (" (python -m reads their environment variables)" if module else "") + ".\n")


def subcommand_help(sub: str) -> str:
    """``backend_help`` by det-launch's subcommand name (``torch``)."""
    return backend_help(next((b for b, v in BACKENDS.items() if v[0] == sub), sub))


def misplaced_option(backend: str, argv: Sequence[str]) -> Optional[str]:
    """A launcher flag among the words before ``--``: one line saying where it
    goes (horovodrun would even take ``--slots`` as ``--slots-per-host``)."""
    shared = _SHARED.get(backend, ())
    flags = {o.flag: o for o in config.OPTIONS if o.flag and o.flag not in shared}
    for word in launcher_words(argv):
        option = flags.get(word.split("=", 1)[0])
        if option is None:
            continue
        sub = BACKENDS.get(backend, (backend,))[0]
        value = "" if option.switch else f" {option.metavar or 'VALUE'}"
        env = (f", or {option.env} for python -m determined_launch.{backend}"
               if option.env and backend in MODULES else "")
        return (f"{option.flag} is a launcher option: put it before the subcommand "
                f"(det-launch {option.flag}{value} {sub} ...{env})")
    return None
