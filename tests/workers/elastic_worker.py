"""Core API worker for tests/test_min_nodes.py, run once per node by
``det-launch exec``: one rank per node, whatever the number of nodes.

It trains on a GLOBAL sample stream: step ``s`` consumes samples
``s*GLOBAL_BATCH .. (s+1)*GLOBAL_BATCH - 1``, split evenly over the ranks of
the current generation, and the ranks' partial sums are combined with a
real ``DistributedContext`` (no torch). So the final weight depends on every
sample's position but not on how many nodes computed it: a run that loses
nodes and resumes from its checkpoint ends exactly where an uninterrupted
one-process run does. Checkpoints every CKPT_EVERY steps (the chief), resumes
from ``det.get_cluster_info().latest_checkpoint``.

It checks for preemption before every step (a node that rejoins preempts
the job), checkpointing and exiting 0 when asked. ``HOLD_AT``: a
2-node generation waits before step HOLD_AT until it is preempted (so that
a node can rejoin before the job ends). ``STEP_SLEEP``: seconds per step.

``PAUSE_AT``/``PAUSE_FILE``: before step PAUSE_AT, the first time only, the
rank on node ``PAUSE_NODE`` (its position in the first node list, passed as
``NODE_ID``) writes PAUSE_FILE and sleeps, so the test can kill that node's
launcher at a known point. The chief prints ``final w=<repr>``.
"""

import os
import pathlib
import sys
import time

from elastic_model import GLOBAL_BATCH, sample, update
from resume_state import restore, save

import determined_launch as det

STEPS = int(os.environ.get("STEPS", "12"))
CKPT_EVERY = int(os.environ.get("CKPT_EVERY", "4"))


def main() -> None:
    info = det.get_cluster_info()
    assert info is not None
    rank, size = info.container_rank, len(info.container_addrs)
    dist = det.core.DistributedContext(rank=rank, size=size, local_rank=0, local_size=1,
                                       cross_rank=rank, cross_size=size)
    if GLOBAL_BATCH % size:
        raise SystemExit(f"global batch {GLOBAL_BATCH} does not divide over {size} ranks")
    per_rank = GLOBAL_BATCH // size
    node = os.environ.get("NODE_ID", "?")
    with det.core.init(distributed=dist) as ctx:
        w, start = restore(ctx, info)
        print(f"node={node} rank={rank} size={size} start={start}", flush=True)
        for step in range(start, STEPS):
            if size == 2 and step == int(os.environ.get("HOLD_AT", "-1")):
                deadline = time.monotonic() + 60  # until a node asks to rejoin (a preemption)
                while not ctx.preempt.should_preempt() and time.monotonic() < deadline:
                    time.sleep(0.05)
            if ctx.preempt.should_preempt():  # e.g. to let a node rejoin: checkpoint, exit 0
                if rank == 0:
                    save(ctx, w, step)
                dist.allgather(None)
                print(f"node={node} preempted at step {step}", flush=True)
                return
            time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
            pause = pathlib.Path(os.environ.get("PAUSE_FILE", "/nonexistent/x"))
            if (node == os.environ.get("PAUSE_NODE") and step == int(os.environ["PAUSE_AT"])
                    and not pause.exists()):
                pause.write_text(str(os.getpid()))
                time.sleep(120)  # killed with its launcher
            first = step * GLOBAL_BATCH + rank * per_rank
            mine = sum(sample(i) for i in range(first, first + per_rank))
            w = update(w, step, sum(dist.allgather(mine)))  # the same order on every rank
            if (step + 1) % CKPT_EVERY == 0:
                if rank == 0:
                    save(ctx, w, step + 1)
                dist.allgather(None)  # a barrier: the checkpoint is committed first
        if rank == 0:
            print(f"final w={w!r}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
