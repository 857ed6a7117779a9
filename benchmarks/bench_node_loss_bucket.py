"""A lost node to training again: claims in a shared run directory vs. in an S3 bucket.

    python benchmarks/bench_node_loss_bucket.py [--reps 3] [--nodes 3]

``bench_node_loss``'s measurement (simulated nodes on loopback, the Core API
worker, ``--max-restarts 9 --min-nodes 1``, a SIGKILL of a worker node's
launcher, then of the chief's, after the checkpoint at step 20), in one run,
alternating two setups (issue 35 §2):

* *directory*: one run directory that every node shares; the claims and
  the checkpoints there;
* *bucket*: every node its own run directory; the checkpoints and the
  claims (conditional puts) in an S3 bucket on moto's server (real HTTP on
  loopback): what a lost node costs on object storage alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_node_loss import one  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--nodes", type=int, default=3)
    args = p.parse_args()
    from tests.storage_servers import S3Server

    s3 = S3Server()
    work = tempfile.mkdtemp(prefix="bench-node-loss-bucket-")
    setups = ("directory", "bucket")
    results: dict[tuple[str, str], list[dict[str, float]]] = {
        (s, w): [] for s in setups for w in ("worker node", "chief")}
    try:
        for _ in range(args.reps):
            for setup in setups:
                for what, victim in (("worker node", args.nodes - 1), ("chief", 0)):
                    env = None
                    if setup == "bucket":
                        block = os.path.join(work, f"s3-{len(results[setup, what])}-{victim}.yaml")
                        with open(block, "w") as f:  # a fresh bucket per run
                            json.dump(s3.block(s3.new_bucket()), f)

                        def env(rank: int, run: str, block: str = block) -> dict[str, str]:
                            return {"DET_RUN_DIR": os.path.join(run, f"run{rank}"),
                                    "DET_CHECKPOINT_STORAGE": block}
                    results[setup, what].append(one(args.nodes, victim, work, "Core API", env))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        s3.stop()
    print(f"{args.nodes} simulated nodes, load average {os.getloadavg()[0]:.1f}")
    for (setup, what), rows in results.items():
        for key in ("decided", "resumed", "training"):
            xs = [r[key] for r in rows]
            print(f"{setup:9s} {what:12s} SIGKILL -> {key:9s} median "
                  f"{statistics.median(xs):6.2f} s  min {min(xs):6.2f}  max {max(xs):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
