"""Time from Ctrl-C (SIGINT) to the launcher's exit, 4 workers that exit on TERM.

    python benchmarks/bench_stop.py [--reps 10] [--slots 4]

Measures, in one run on the same machine, for each repetition:

* ours: ``det-launch --slots N torch -- python worker.py``, SIGINT once every
  worker has started, until the launcher has exited (and, by its contract,
  every process it started is gone);
* the peer: bare ``torchrun --nproc-per-node N worker.py`` with the same
  workers and the same signal, until torchrun exits.

Target (issue 14): median <= 1 s for ours. Prints medians, min/max and the
ratio ours/peer.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = """
import os, time
open(os.path.join(os.environ["READY_DIR"], "rank-" + os.environ["RANK"]), "w").close()
time.sleep(600)
"""


def one(argv: list[str], slots: int, env: dict[str, str]) -> float:
    with tempfile.TemporaryDirectory() as ready:
        env = dict(env, READY_DIR=ready)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while len(os.listdir(ready)) < slots:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"workers did not start: {argv}")
            time.sleep(0.02)
        time.sleep(0.2)  # past start-up, as a person pressing Ctrl-C would be
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        return time.monotonic() - sent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--slots", type=int, default=4)
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
        worker = f.name
    ours_argv = [sys.executable, "-m", "determined_launch.cli", "--slots", str(args.slots),
                 "torch", "--", sys.executable, worker]
    peer_argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc-per-node={args.slots}", worker]
    ours, peer = [], []
    try:
        for _ in range(args.reps):  # interleaved, so load affects both alike
            ours.append(one(ours_argv, args.slots, env))
            peer.append(one(peer_argv, args.slots, env))
    finally:
        os.unlink(worker)
    for name, xs in (("det-launch", ours), ("bare torchrun", peer)):
        print(f"{name:14s} SIGINT->exit median {statistics.median(xs):.3f}s "
              f"min {min(xs):.3f}s max {max(xs):.3f}s (n={len(xs)})")
    ratio = statistics.median(ours) / statistics.median(peer)
    verdict = "meets" if statistics.median(ours) <= 1.0 else "MISSES"
    print(f"ratio ours/peer {ratio:.2f}; target median <= 1 s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
