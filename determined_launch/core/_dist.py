"""What the Core API needs from a DistributedContext.

A structural type rather than the class itself, so each piece of the Core
API states the few collectives it relies on, and pure-logic unit tests can
drive it with an in-process stand-in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Protocol

from determined_launch import envvars


class Collectives(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def allgather(self, stuff: Any) -> list[Any]: ...

    def broadcast(self, stuff: Any) -> Any: ...

    def gather(self, stuff: Any) -> Optional[list[Any]]: ...

    def close(self) -> None: ...


def note_finished(rank: int, env: Mapping[str, str] = os.environ) -> None:
    """Tell our launcher that ``rank`` finished its work (core.init() exited
    cleanly), so that a death at interpreter exit is reported as such. Outside
    our launchers (no status directory) and on any error: nothing."""
    status_dir = env.get(envvars.WRAP_RANK_STATUS_DIR)
    if not status_dir:
        return
    try:
        path = os.path.join(status_dir, envvars.RANK_FINISHED_FILE.format(rank=rank))
        with open(path, "x", encoding="utf-8"):
            pass
    except OSError:
        pass  # a note for the summary: never a reason to fail a finished rank
