"""Small user-facing helpers from ``import determined as det``: InvalidHP,
import_from_path, LOG_FORMAT (and ``show_info_logs``, which uses it).

Kept apart from the package ``__init__`` so the lazy table can load them
without importing anything heavy (no torch, no ZeroMQ).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterator

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"


def package_version() -> str:
    """pyproject.toml's ``version``, as the installed package's metadata says it:
    the one source of ``determined_launch.__version__``, ``det-launch --version``
    and checkpoint metadata (here, so a lower layer reads it without importing the
    package's face). A checkout on ``PYTHONPATH``, never installed, has none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("determined_launch")
    except PackageNotFoundError:
        return "0+unknown"


def show_info_logs() -> None:
    """INFO lines on stderr when the program set up no logging of its own
    (a configured root logger wins), so progress lines show by default."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


class InvalidHP(Exception):
    """Raise from trial code to say "these hyperparameters cannot work".

    The PyTorch loop checkpoints (if not current) and re-raises it. ``msg`` must
    be a str, as upstream.
    """

    def __init__(self, msg: str = "InvalidHP raised") -> None:
        if not isinstance(msg, str):
            raise TypeError(
                f"InvalidHP(msg) takes a str message, got {type(msg).__name__}: {msg!r}"
            )
        super().__init__(msg)
        self.msg = msg


def _module_dir(module: object) -> str | None:
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        return os.path.realpath(os.path.dirname(file))
    paths = getattr(module, "__path__", None)  # namespace packages have no __file__
    if paths is not None:
        for p in list(paths):
            return os.path.realpath(p)
    return None


@contextlib.contextmanager
def import_from_path(path: str | os.PathLike[str]) -> Iterator[None]:
    """Import from ``path`` inside the block, e.g. a checkpoint's ``code/`` directory.

    ``path`` is put first on ``sys.path`` for the duration; modules first
    imported from it during the block are dropped from ``sys.modules`` at exit,
    so a second checkpoint's ``model_def`` is not shadowed by the first one's.
    Objects already imported stay usable. Not re-entrant.
    """
    root = os.path.realpath(os.fspath(path))
    before = set(sys.modules)
    sys.path.insert(0, os.fspath(path))
    try:
        yield
    finally:
        try:
            sys.path.remove(os.fspath(path))
        except ValueError:  # the block removed it itself
            pass
        for name in set(sys.modules) - before:
            where = _module_dir(sys.modules.get(name))
            if where is not None and (where == root or where.startswith(root + os.sep)):
                sys.modules.pop(name, None)
