"""Worker for tests/test_stragglers.py, without torch: ``python straggler_worker.py
launcher`` starts one worker per slot (det.launch_per_slot); each polls
``should_preempt(block=False)`` every step (the ranks agree only there), and rank 1's
steps take 4x the others' from step SLOW_FROM to SLOW_TO."""

import os
import sys
import time

import determined_launch as det


def worker() -> None:
    dist = det.core.DistributedContext.from_env()
    slow = range(int(os.environ.get("SLOW_FROM", "200")), int(os.environ.get("SLOW_TO", "600")))
    with det.core.init(distributed=dist) as ctx:
        for step in range(int(os.environ.get("STEPS", "2000"))):
            time.sleep(0.008 if dist.rank == 1 and step in slow else 0.002)
            ctx.preempt.should_preempt(block=False)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(det.launch_per_slot(lambda rank, local_rank: [sys.executable, __file__, "worker"]))
