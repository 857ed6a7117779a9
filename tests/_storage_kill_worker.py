"""A training process for the kill test: two ranks (threads with in-process
collectives) saving sharded checkpoints to S3 in a loop, resuming from
``latest()``. Runs in a forkserver child so that 20 kills cost milliseconds
of start-up each, not a Python start with s3fs imported."""

from __future__ import annotations

import pathlib
import threading
from typing import Any

from determined_launch.core._rundir import RunDir
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.storage import open_storage, parse_storage
from determined_launch.core.storage.objectstore import make_filesystem


class _Ranks:
    """Two ranks as threads; every collective is an exchange at a barrier.
    (Not tests._core_helpers: importing it pulls pytest into the forkserver,
    whose threads would then be forked with their locks held.)"""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=30)
        self._slots: list[Any] = [None] * size

    def exchange(self, rank: int, stuff: Any) -> list[Any]:
        self._slots[rank] = stuff
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()
        return out


class _Rank:
    def __init__(self, group: _Ranks, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.size

    def allgather(self, stuff: Any) -> list[Any]:
        return self.group.exchange(self.rank, stuff)

    def gather(self, stuff: Any) -> Any:
        out = self.allgather(stuff)
        return out if self.rank == 0 else None

    def broadcast(self, stuff: Any) -> Any:
        return self.allgather(stuff)[0]

    def close(self) -> None:
        pass

SHARD_BYTES = 48 * 1024


def shard_content(step: int, rank: int) -> bytes:
    return f"{step}-{rank}|".encode() * (SHARD_BYTES // 8)


def train_forever(block: dict[str, Any], run: str, ready: Any) -> None:
    """Save forever; ``ready`` is set once both ranks are about to save (so
    the test's kill times fall among saves, not in botocore's start-up)."""
    group = _Ranks(2)
    spec = parse_storage(block, where="kill test")
    fs = make_filesystem(spec)
    open_storage(spec, fs=fs).list_ids()  # botocore's start-up happens before `ready`

    def rank_main(rank: int) -> None:
        dist = _Rank(group, rank)
        backend = open_storage(spec, fs=fs)
        run_dir = pathlib.Path(run) if rank == 0 else pathlib.Path(run) / "rank1"
        ctx = CheckpointContext(dist, backend, RunDir(run_dir, trial_id=None))
        latest = ctx.latest() if rank == 0 else None
        start = dist.broadcast(ctx.get_metadata(latest)["steps_completed"] if latest else 0)
        step = start
        dist.allgather(None)
        ready.set()
        while True:
            step += 1
            with ctx.store_path({"steps_completed": step}, shard=True) as (path, _):
                (path / f"shard-{rank}").write_bytes(shard_content(step, rank))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
