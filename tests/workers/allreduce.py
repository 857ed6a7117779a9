"""A gloo worker for launcher tests.

Prints ``world=W rank=R sum=S`` after an all_reduce of (rank + 1). With
``FAIL_RANK``/``FAIL_CODE`` set, that rank exits with FAIL_CODE after the
first all_reduce while the others block in a second collective, which is the
hang the supervisor must break. ``READY_DIR`` gets a file per rank once the
first collective is done.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"world={world} rank={rank} sum={int(t.item())} chief={os.environ.get('DET_CHIEF_IP')}")
sys.stdout.flush()
ready = os.environ.get("READY_DIR")
if ready:
    open(os.path.join(ready, f"rank-{rank}"), "w").close()
fail_rank = os.environ.get("FAIL_RANK")
if fail_rank is not None:
    if rank == int(fail_rank):
        time.sleep(0.5)
        print(f"rank {rank} failing on purpose", file=sys.stderr)
        os._exit(int(os.environ.get("FAIL_CODE", "3")))
    dist.barrier()  # blocks forever: the failed rank never arrives
    time.sleep(600)
if os.environ.get("SLEEP_FOREVER"):
    time.sleep(600)
dist.destroy_process_group()
