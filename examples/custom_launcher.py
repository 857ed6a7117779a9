"""The seed tutorial's custom launcher, in two lines with ``launch_per_slot``.

    python examples/custom_launcher.py            # launcher: one worker per slot
    DET_LAUNCH_SLOTS=3 python examples/custom_launcher.py

The launcher re-invokes this file as ``worker``; every worker does a
"distributed increment" over the DistributedContext-free path (environment
only), and the first failing worker stops the rest.
"""

from __future__ import annotations

import os
import sys

import determined_launch as det


def launcher_main() -> int:
    return det.launch_per_slot(lambda rank, local_rank: [sys.executable, __file__, "worker"])


def worker_main() -> int:
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"worker {rank} of {size} (local rank {os.environ['LOCAL_RANK']}) says hello")
    return int(os.environ.get("EXAMPLE_FAIL_RANK", "-1") == str(rank)) * 7


if __name__ == "__main__":
    sys.exit(worker_main() if sys.argv[1:] == ["worker"] else launcher_main())
