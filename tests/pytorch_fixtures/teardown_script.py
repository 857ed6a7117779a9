"""After ``pytorch.init()`` exits, is the process group it started ended?

Run as 2 ranks (``det-launch --slots 2 torch -- python teardown_script.py``).
The DDP model and the context stay alive past the ``with`` block, as in a
script that keeps its trial; each rank prints whether the default group is
still initialized and how many of gloo's threads are left. Threads left over
are what aborts a rank at interpreter exit (issue 23 item 1b).
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn

from determined_launch import pytorch


def gloo_threads() -> int:
    names = [open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")]
    return sum("gloo" in n for n in names)


with pytorch.init(hparams={"global_batch_size": 2}, seed=1) as ctx:
    model = ctx.wrap_model(nn.Linear(4, 1))
    model(torch.ones(2, 4)).sum().backward()
    gathered = [None] * ctx.distributed.size
    dist.all_gather_object(gathered, ctx.distributed.rank)
    during = gloo_threads()

print(json.dumps({"rank": ctx.distributed.rank, "ddp": type(model).__name__,
                  "during": during, "initialized": dist.is_initialized(),
                  "gloo_threads": gloo_threads()}), flush=True)
