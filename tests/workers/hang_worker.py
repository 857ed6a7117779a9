"""Worker for tests/test_hang.py: restart_worker.py's model and checkpoints,
with one Core API poll per step (its progress), where rank HANG_RANK hangs
at step HANG_AT the first time (HANG_MARKER remembers it): HANG=sleep sleeps
inside ``train_batch``, HANG=stop stops itself with SIGSTOP. The chief
prints ``final w=<repr>``.
"""

import os
import pathlib
import signal
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


def main() -> None:
    rank, distributed, total, barrier = collectives()
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
    main()
