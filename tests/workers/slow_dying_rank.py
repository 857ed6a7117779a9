"""Rank 1 fails in the middle of allgathers and then takes a while to exit after its
sockets closed (a slow interpreter teardown: CUDA contexts, data loader workers, a
flushing logger); rank 0 notices the disconnect at once and exits first. The launcher
must name rank 1."""

import atexit
import os
import time

import determined_launch as det

if os.environ.get("RANK") == "1":
    # registered before the context exists, so it runs after the context's own exit
    # handler closed the sockets (atexit runs last-registered first)
    atexit.register(time.sleep, float(os.environ.get("SLOW_EXIT", "1.5")))
d = det.core.DistributedContext.from_env()
for i in range(1000):
    d.allgather(i)
    if i == 5 and d.rank == 1:
        raise SystemExit(7)
    time.sleep(0.01)
