"""A Horovod worker for launcher tests.

Prints one line per rank: its place in the world, an allreduce of rank+1,
an allgather_object of the ranks, and (when the package has it) an
allgather through ``DistributedContext.from_horovod(hvd)``. With
``FAIL_RANK`` set, that rank exits with ``FAIL_CODE`` after the first
collective while the others block in the next one.
"""

import os
import sys
import time

import horovod.torch as hvd
import psutil
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum)
gathered = hvd.allgather_object(rank)
try:
    from determined_launch.core.distributed import DistributedContext
except ImportError:
    dctx = "unavailable"
else:
    with_ctx = DistributedContext.from_horovod(hvd)
    dctx = "ok" if with_ctx.allgather(rank) == list(range(size)) else "wrong"
    with_ctx.close()


def secret_on_a_command_line() -> bool:
    """Whether the job secret shows in any process's argv (``ps`` shows those)."""
    secret = os.environ.get("DET_DIST_SECRET")
    for p in psutil.process_iter(["cmdline"]):
        if secret and any(secret in part for part in p.info["cmdline"] or []):
            return True
    return False


print(
    f"world={size} rank={rank} local={hvd.local_rank()}/{hvd.local_size()} "
    f"cross={hvd.cross_rank()}/{hvd.cross_size()} sum={int(total.item())} "
    f"gathered={gathered} dctx={dctx} chief={os.environ.get('DET_CHIEF_IP')} "
    f"use={os.environ.get('USE_HOROVOD')} secret={'DET_DIST_SECRET' in os.environ} "
    f"leak={secret_on_a_command_line()} "
    f"jobdir={os.environ.get('DET_LAUNCH_JOB_DIR')}",
    flush=True,
)
ready = os.environ.get("READY_DIR")
if ready:
    open(os.path.join(ready, f"rank-{rank}"), "w").close()
fail_rank = os.environ.get("FAIL_RANK")
if fail_rank is not None:
    if rank == int(fail_rank):
        print(f"rank {rank} failing on purpose", file=sys.stderr, flush=True)
        os._exit(int(os.environ.get("FAIL_CODE", "3")))
    hvd.allreduce(torch.tensor([1.0]))  # blocks: the failed rank never arrives
    time.sleep(600)
if os.environ.get("SLEEP_FOREVER"):
    time.sleep(600)
