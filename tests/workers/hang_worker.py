"""Worker for tests/test_hang.py: restart_worker.py's model and checkpoints,
with one Core API poll per step (its progress), where rank HANG_RANK hangs
at step HANG_AT the first time (HANG_MARKER remembers it): HANG=sleep sleeps
inside ``train_batch``, HANG=stop stops itself with SIGSTOP. The chief
prints ``final w=<repr>``.

Under torchrun its collectives are gloo's (restart_worker.py); ``python
hang_worker.py launcher`` starts one worker per slot (det.launch_per_slot) whose
collectives are our DistributedContext's, without torch.
"""

import os
import pathlib
import signal
import sys
import time
from typing import Callable

from restart_model import sample, update
from restart_worker import collectives
from resume_state import restore, save

import determined_launch as det

STEPS = int(os.environ.get("STEPS", "16"))
CKPT_EVERY = int(os.environ.get("CKPT_EVERY", "4"))


def train_batch(w: float, step: int, rank: int, total: Callable[[float], float]) -> float:
    if rank == int(os.environ["HANG_RANK"]) and step == int(os.environ["HANG_AT"]):
        marker = pathlib.Path(os.environ["HANG_MARKER"])
        if not marker.exists():
            marker.touch()
            print(f"rank={rank} hanging at step {step} ({os.environ['HANG']})", flush=True)
            if os.environ["HANG"] == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                time.sleep(3600)
    return update(w, step, total(sample(step, rank)))


def per_slot() -> tuple[int, det.core.DistributedContext, Callable[[float], float],
                        Callable[[], None]]:
    dist = det.core.DistributedContext.from_env()

    def total(x: float) -> float:
        return sum(dist.allgather(x))

    return dist.rank, dist, total, lambda: None


def main() -> None:
    rank, distributed, total, barrier = per_slot() if sys.argv[1:] == ["worker"] else collectives()
    info = det.get_cluster_info()
    assert info is not None  # under a launcher
    with det.core.init(distributed=distributed) as ctx:
        w, start = restore(ctx, info)
        print(f"rank={rank} generation start={start}", flush=True)
        for step in range(start, STEPS):
            w = train_batch(w, step, rank, total)
            time.sleep(0.02)
            ctx.preempt.should_preempt(block=False)
            if (step + 1) % CKPT_EVERY == 0 and rank == 0:
                save(ctx, w, step + 1)
            if (step + 1) % CKPT_EVERY == 0:
                barrier()
        if rank == 0:
            print(f"final w={w!r}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["launcher"]:
        sys.exit(det.launch_per_slot(lambda rank, local_rank: [sys.executable, __file__, "worker"]))
    main()
