"""Core API worker for tests/test_restarts.py: a "model" whose final weight
depends on every sample's position, trained with a real torch.distributed
(gloo) all_reduce, checkpointed every CKPT_EVERY steps and resumed from
``det.get_cluster_info().latest_checkpoint`` (what ``--max-restarts`` sets).

Without torchrun (``WORLD_SIZE`` unset) it runs as one process without torch.
``CRASH_RANK``/``CRASH_AT``: that rank exits with status 3 just before step
CRASH_AT, the first time only (``CRASH_MARKER`` remembers it), or every time
with ``CRASH_ALWAYS=1``. The chief prints ``final w=<repr>``.
"""

import os
import pathlib
import sys
import time
from typing import Callable, Optional

from restart_model import sample, update
from resume_state import restore, save

import determined_launch as det

STEPS = int(os.environ.get("STEPS", "16"))
CKPT_EVERY = int(os.environ.get("CKPT_EVERY", "4"))


def collectives() -> tuple[int, Optional[det.core.DistributedContext], Callable[[float], float],
                           Callable[[], None]]:
    """(rank, context, sum over ranks, barrier): torch.distributed under
    torchrun; one process (no torch) otherwise."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return 0, None, lambda x: x, lambda: None
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")

    def total(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    return (dist.get_rank(), det.core.DistributedContext.from_torch_distributed(), total,
            dist.barrier)


def main() -> None:
    rank, distributed, total, barrier = collectives()
    info = det.get_cluster_info()
    with det.core.init(distributed=distributed) as ctx:
        w, start = restore(ctx, info)
        print(f"rank={rank} generation start={start}", flush=True)
        for step in range(start, STEPS):
            if (rank == int(os.environ.get("CRASH_RANK", "-1"))
                    and step == int(os.environ.get("CRASH_AT", "-1"))):
                marker = pathlib.Path(os.environ["CRASH_MARKER"])
                if os.environ.get("CRASH_ALWAYS") or not marker.exists():
                    marker.touch()
                    print(f"rank={rank} crashing at step {step}", flush=True)
                    os._exit(3)
            w = update(w, step, total(sample(step, rank)))
            time.sleep(0.01)
            if (step + 1) % CKPT_EVERY == 0 and rank == 0:
                save(ctx, w, step + 1)
            if (step + 1) % CKPT_EVERY == 0:
                barrier()  # every rank past the checkpoint before anyone crashes
        if rank == 0:
            print(f"final w={w!r}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
