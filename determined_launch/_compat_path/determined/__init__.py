"""Stand-in ``determined`` package: only ``python -m determined.launch.X`` works.

Importing it for anything else raises ``ModuleNotFoundError`` with a one-line
hint, so code that would silently get half an API fails where the import is.
"""

from __future__ import annotations

import sys

#: The module names Determined's launch commands use; each runs ours.
ENTRY_POINTS = frozenset(
    f"determined.launch.{name}"
    for name in ("wrap_rank", "torch_distributed", "horovod", "deepspeed")
)


def _running_entry_point() -> bool:
    """True while ``python -m determined.launch.X`` locates its module.

    ``runpy`` imports the parent packages first, with ``sys.argv[0]`` still
    ``"-m"``; ``sys.orig_argv`` (3.10+) names the module asked for.
    """
    if not sys.argv or sys.argv[0] != "-m":
        return False
    argv = list(getattr(sys, "orig_argv", []))
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1] in ENTRY_POINTS
    return False


if not _running_entry_point():
    raise ModuleNotFoundError(
        "'determined' is not installed; determined_launch provides only "
        "`python -m determined.launch.{wrap_rank,torch_distributed,horovod,deepspeed}` "
        "under that name: change the import to `import determined_launch as det`",
        name="determined",
    )
