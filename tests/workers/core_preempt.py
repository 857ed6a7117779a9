"""Launcher and worker for tests/test_preempt_processes.py.

    python core_preempt.py launcher   # one worker per slot via det.launch_per_slot
    python core_preempt.py worker     # started by the launcher

Each worker runs "training steps" (one allgather each, standing in for an
all-reduce) and calls should_preempt every step; when it says True the worker
prints the call index and exits 0. PREEMPT_BLOCK=1 uses blocking calls.
"""

from __future__ import annotations

import os
import sys
import time

import determined_launch as det


def worker() -> int:
    dist = det.core.DistributedContext.from_env()
    block = os.environ.get("PREEMPT_BLOCK") == "1"
    with det.core.init(distributed=dist, preempt_sync_period=0.02) as ctx:
        step = 0
        while step < 100_000:
            step += 1
            dist.allgather(step)
            time.sleep(0.002)
            if step == 1 and dist.rank == 0:
                ctx.train.report_training_metrics(step, {"started": 1})  # tells the test
            if ctx.preempt.should_preempt(block=block):
                print(f"stopped rank={dist.rank} call={ctx.preempt.calls}", flush=True)
                return 0
    return 1


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker())
    sys.exit(det.launch_per_slot(lambda rank, local_rank: [sys.executable, __file__, "worker"]))
