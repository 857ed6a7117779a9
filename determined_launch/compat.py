"""Determined's module names in worker commands (``python3 -m determined.launch.X``).

Entrypoints and custom launchers written for Determined start
``python3 -m determined.launch.wrap_rank|torch_distributed|horovod|deepspeed``.
When the real ``determined`` is not importable, our launchers put
``_compat_path`` first on their workers' ``PYTHONPATH``; its stand-in
``determined`` package runs ours under those names and refuses every other
use with a one-line hint. A real installation always wins: ``PYTHONPATH``
precedes site-packages, so the directory is added only after checking that
nothing else provides ``determined``.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Optional

#: The directory our launchers add to their workers' ``PYTHONPATH``.
COMPAT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_compat_path")


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a or ".") == os.path.realpath(b)


def real_determined_importable(path: Optional[Sequence[str]] = None) -> bool:
    """Whether a ``determined`` other than our stand-in is on ``path``
    (default ``sys.path``); our own directory is left out of the search."""
    search = [p for p in (sys.path if path is None else path) if not _same_dir(p, COMPAT_DIR)]
    return importlib.machinery.PathFinder.find_spec("determined", search) is not None


def worker_pythonpath(env: Mapping[str, str], enabled: bool) -> str:
    """The ``PYTHONPATH`` our workers get: the inherited one, with the
    compatibility directory first when ``enabled`` and no real ``determined``
    is importable, and without it otherwise (a nested launch inherits it)."""
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in inherited if not _same_dir(p, COMPAT_DIR)]
    if enabled and not real_determined_importable():
        rest.insert(0, COMPAT_DIR)
    return os.pathsep.join(rest)
