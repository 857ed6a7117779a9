"""The demo's training step: one allreduce under whichever launcher started it."""

import os

import torch

if os.environ.get("USE_HOROVOD"):
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum).item()
else:
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    total = t.item()
print(f"rank {rank} of {size}: sum of rank+1 is {total:g} (expected {size * (size + 1) // 2})")
