"""Private files written for a job: never seen half-written."""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Iterable
from typing import Optional

from determined_launch import envvars
from determined_launch.supervisor.events import Event, RankExited, RankFinished, RankLostPeers


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


def lost_peers(name: str) -> Optional[RankLostPeers]:
    """What a "rank-N.lost-P,Q" note says (``core.distributed.wiring``), else None."""
    prefix, _, rest = envvars.RANK_LOST_FILE.partition("{rank}")
    middle, _, _ = rest.partition("{peers}")
    rank, sep, peers = name[len(prefix):].partition(middle)
    if not (name.startswith(prefix) and sep and rank.isdigit()):
        return None
    listed = peers.split(",")
    if not all(p.isdigit() and len(p) < 8 for p in listed) or len(listed) > 32:
        return None
    return RankLostPeers(int(rank), tuple(int(p) for p in listed))


def finished_rank(name: str) -> Optional[int]:
    """N for core.init()'s "rank-N.finished" note, else None."""
    prefix, _, suffix = envvars.RANK_FINISHED_FILE.partition("{rank}")
    middle = name[len(prefix):len(name) - len(suffix)]
    if name.startswith(prefix) and name.endswith(suffix) and middle.isdigit():
        return int(middle)
    return None


def status_events(status_dir: str, seen: set[str]) -> list[Event]:
    """What wrap_rank's and core.init()'s per-rank status files say that
    ``seen`` (updated) did not list yet."""
    try:
        names = os.listdir(status_dir)
    except OSError:
        return []
    out: list[Event] = []
    # "rank-N.lost-..." and "rank-N.finished" notes before "rank-N.json": a rank's
    # failure is judged with what it said before it exited
    for name in sorted(names, key=lambda n: (".lost-" not in n, n)):
        if name in seen:
            continue
        lost = lost_peers(name)
        if lost is not None:
            seen.add(name)
            out.append(lost)
            continue
        finished = finished_rank(name)
        if finished is not None:
            seen.add(name)
            out.append(RankFinished(finished))
            continue
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(status_dir, name), encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue  # being written (writers rename atomically, but be lenient)
        seen.add(name)
        status, rank, when = record.get("exit_status"), record.get("rank"), record.get("time")
        if isinstance(status, int) and isinstance(rank, int):
            t = float(when) if isinstance(when, (int, float)) else time.time()
            out.append(RankExited(rank, status, t))
    return out
