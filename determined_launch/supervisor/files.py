"""Private files written for a job: never seen half-written."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from typing import Optional

from determined_launch import envvars


def write_private_file(path: str, content: str, mode: int = 0o600) -> None:
    """Write atomically (temp file + rename) so no reader sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_leftovers(patterns: Iterable[str]) -> None:
    """Remove what a plan says its tools leave behind (``LaunchPlan.leftovers``);
    a file already gone or not ours is left to whoever owns it."""
    for pattern in patterns:
        for path in glob.glob(pattern):
            try:
                os.unlink(path)
            except OSError:
                pass


def finished_rank(name: str) -> Optional[int]:
    """N for core.init()'s "rank-N.finished" note, else None."""
    prefix, _, suffix = envvars.RANK_FINISHED_FILE.partition("{rank}")
    middle = name[len(prefix):len(name) - len(suffix)]
    if name.startswith(prefix) and name.endswith(suffix) and middle.isdigit():
        return int(middle)
    return None
