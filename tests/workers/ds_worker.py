"""A DeepSpeed worker for launcher tests.

``deepspeed.init_distributed("gloo")``, an all_reduce of rank+1, and (when
the package has it) an allgather through ``DistributedContext.from_deepspeed()``.
``FAIL_RANK``/``FAIL_CODE`` and ``SLEEP_FOREVER`` as in hvd_worker.py.
"""

import os
import sys
import time

import deepspeed
import psutil
import torch
import torch.distributed as dist

deepspeed.init_distributed("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
try:
    from determined_launch.core.distributed import DistributedContext
except ImportError:
    dctx = "unavailable"
else:
    ctx = DistributedContext.from_deepspeed()
    dctx = "ok" if ctx.allgather(rank) == list(range(size)) else "wrong"
    ctx.close()


def secret_on_a_command_line() -> bool:
    """Whether the job secret shows in any process's argv (``ps`` shows those)."""
    secret = os.environ.get("DET_DIST_SECRET")
    for p in psutil.process_iter(["cmdline"]):
        if secret and any(secret in part for part in p.info["cmdline"] or []):
            return True
    return False


print(
    f"world={size} rank={rank} local={os.environ.get('LOCAL_RANK')} "
    f"cross={os.environ.get('CROSS_RANK')}/{os.environ.get('CROSS_SIZE')} sum={int(t.item())} "
    f"dctx={dctx} chief={os.environ.get('DET_CHIEF_IP')} use={os.environ.get('USE_DEEPSPEED')} "
    f"secret={'DET_DIST_SECRET' in os.environ} leak={secret_on_a_command_line()} "
    f"jobdir={os.environ.get('DET_LAUNCH_JOB_DIR')} "
    f"probe={os.environ.get('DS_TEST_PROBE', '').encode().hex()}",
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
    dist.barrier()  # blocks: the failed rank never arrives
    time.sleep(600)
if os.environ.get("SLEEP_FOREVER"):
    time.sleep(600)
dist.destroy_process_group()
