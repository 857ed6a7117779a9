"""Launch overhead: our launcher vs bare torchrun, 4 workers of ``python -c pass``.

Run by hand (never a timed test): ``python benchmarks/bench_launch.py [--reps 9]``.
Both commands run interleaved in the same process, so machine noise hits both;
the figure that matters is the ratio of medians (target: at most 1.1x).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKERS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bare_torchrun() -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
        "--nproc_per_node", str(WORKERS), "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), "--max_restarts", "0", "--no_python",
        sys.executable, "-c", "pass",
    ]


def ours() -> list[str]:
    return [sys.executable, "-m", "determined_launch.torch_distributed",
            sys.executable, "-c", "pass"]


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    # This machine sets PYTHONDONTWRITEBYTECODE, so an editable checkout would
    # recompile its sources on every start while torch's installed modules
    # have bytecode; a private cache makes both behave like installed code.
    cache = tempfile.mkdtemp(prefix="bench-pycache-")
    env = dict(os.environ, PYTHONPATH=str(REPO), DET_LAUNCH_SLOTS=str(WORKERS),
               OMP_NUM_THREADS="1", PYTHONPYCACHEPREFIX=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    timed(ours(), env)  # warm the page cache for both
    timed(bare_torchrun(), env)
    results: dict[str, list[float]] = {"torchrun": [], "det-launch": []}
    for _ in range(args.reps):
        results["torchrun"].append(timed(bare_torchrun(), env))
        results["det-launch"].append(timed(ours(), env))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.processor() or 'cpu'}")
    print(f"{WORKERS} workers of `python -c pass`, {args.reps} interleaved runs each")
    for k, v in results.items():
        print(f"  {k:11s} median {med[k]:.3f}s  min {min(v):.3f}s  max {max(v):.3f}s")
    ratio = med["det-launch"] / med["torchrun"]
    print(f"ratio det-launch / torchrun (medians): {ratio:.3f}x  (target <= 1.10x)")


if __name__ == "__main__":
    main()
