"""Worker for tests/test_core_processes.py, started by det.launch_per_slot.

    python core_ranks.py launcher   # one worker per slot
SCENARIO (environment) picks what every worker does; each prints one
"rank=N ..." line that the test reads.
"""

from __future__ import annotations

import os
import sys

import determined_launch as det


def sharded(ctx: det.core.Context, fail_rank: int) -> str:
    rank = ctx.distributed.rank
    try:
        with ctx.checkpoint.store_path({"steps_completed": 7, f"r{rank}": rank}, shard=True) as (
            path,
            storage_id,
        ):
            (path / f"shard-{rank}").write_text(str(rank))
            if rank == fail_rank:
                raise OSError("disk full")
    except Exception as e:  # reported to the test
        return f"error={type(e).__name__}: {e}"
    with ctx.checkpoint.restore_path(storage_id) as path:
        files = ",".join(sorted(os.listdir(path)))
    return (
        f"committed={storage_id} files={files} metadata={ctx.checkpoint.get_metadata(storage_id)}"
    )


def chief_only(ctx: det.core.Context) -> str:
    try:
        return f"answer={ctx.preempt.should_preempt()}"
    except RuntimeError as e:
        return f"error={e}"


def worker() -> int:
    scenario = os.environ["SCENARIO"]
    mode = det.core.PreemptMode.ChiefOnly if scenario == "chief-only" else None
    kwargs = {"preempt_mode": mode} if mode else {}
    dist = det.core.DistributedContext.from_env()
    with det.core.init(distributed=dist, **kwargs) as ctx:
        if scenario == "chief-only":
            out = chief_only(ctx)
        else:
            out = sharded(ctx, int(os.environ.get("FAIL_RANK", "-1")))
        print(f"rank={dist.rank} {out}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker())
    sys.exit(det.launch_per_slot(lambda rank, local_rank: [sys.executable, __file__, "worker"]))
