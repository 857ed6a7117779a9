"""A CUDA worker for tests/test_gpu.py: NCCL collectives on the GPU its
LOCAL_RANK names, and our DistributedContext beside them.

Prints one JSON line: the world, the device, the NCCL all_reduce sum of
(rank + 1) and the DistributedContext's allgather of the ranks.
"""

import json
import os

import torch
import torch.distributed as dist

from determined_launch.core import DistributedContext

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
t = torch.tensor([dist.get_rank() + 1.0], device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
ctx = DistributedContext.from_torch_distributed()
gathered = ctx.allgather(ctx.rank)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(),
                  "backend": dist.get_backend(), "device": str(t.device),
                  "sum": float(t.item()), "gathered": gathered,
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
ctx.close()
dist.destroy_process_group()
