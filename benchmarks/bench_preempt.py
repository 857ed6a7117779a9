"""Cost of ``should_preempt()`` while no preemption is pending.

    python benchmarks/bench_preempt.py [--ranks 4] [--calls 200000]

Measures, in one run on the same machine:

* ours, ``block=False``: median, p99 and mean time per call (the mean
  includes the agreements at sync points, so it is the amortized cost);
* ours, ``block=True``: one agreement (``allgather``) per call;
* the peer, Determined 0.38.1 (``benchmarks/peer_env.sh``): its off-cluster
  ``PreemptContext`` in ``WorkersAskChief`` mode, one ``broadcast`` on its own
  ZeroMQ ``DistributedContext`` per call. Determined has no non-blocking
  check (its docs: "not performant enough to call every batch").

Ranks are separate processes on one node in a tight loop (no training work
between calls), which is the worst case for the agreement's share.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stats(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)
    return {
        "median_us": statistics.median(s) / 1e3,
        "p99_us": s[int(len(s) * 0.99)] / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
    }


def timed_calls(
    fn: Callable[[], Any], n: int, resync: Optional[Callable[[], Any]] = None
) -> list[int]:
    """Time ``n`` calls one by one. ``resync`` (untimed, every 200 calls)
    keeps the chief from running far ahead of the other ranks: Determined's
    pipelined broadcast fails ("Out-of-order server message detected") once
    its ZeroMQ queues overflow in a tight loop."""
    clock = time.perf_counter_ns
    out = [0] * n
    for i in range(n):
        if resync is not None and i % 200 == 0:
            resync()
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


def one_node(rank: int, size: int) -> dict[str, int]:
    """Rank layout of ``size`` workers on one node (both libraries' keywords)."""
    return {
        "rank": rank,
        "size": size,
        "local_rank": rank,
        "local_size": size,
        "cross_rank": 0,
        "cross_size": 1,
    }


def ours_worker(rank: int, size: int, port: int, calls: int, blocking_calls: int) -> None:
    sys.path.insert(0, REPO)
    from determined_launch.core import DistributedContext, PreemptContext

    dist = DistributedContext(
        **one_node(rank, size),
        port=port,
        secret="bench-preempt-secret-0123456789",
        ipc_dir=os.environ["BENCH_IPC_DIR"],  # node-local ipc://, as under our launchers
    )
    preempt = PreemptContext(dist)
    timed_calls(lambda: preempt.should_preempt(block=False), 2000)  # warm up
    nonblocking = timed_calls(lambda: preempt.should_preempt(block=False), calls)
    blocking = timed_calls(preempt.should_preempt, blocking_calls, lambda: dist.allgather(None))
    dist.close()
    print(
        json.dumps(
            {
                "rank": rank,
                "nonblocking": stats(nonblocking),
                "blocking": stats(blocking),
            }
        ),
        flush=True,
    )


def peer_worker(rank: int, size: int, port: int, blocking_calls: int) -> None:
    from determined import core

    dist = core.DistributedContext(
        **one_node(rank, size),
        pub_port=port,
        pull_port=port + 1,
    )
    preempt = core.DummyPreemptContext(dist, core.PreemptMode.WorkersAskChief)
    preempt.start()
    timed_calls(preempt.should_preempt, 200, lambda: dist.allgather(None))
    blocking = timed_calls(preempt.should_preempt, blocking_calls, lambda: dist.allgather(None))
    dist.close()
    print(json.dumps({"rank": rank, "blocking": stats(blocking)}), flush=True)


def free_port_pair() -> int:
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
        try:
            with socket.socket() as b:
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def run_ranks(python: str, mode: str, size: int, extra: list[str]) -> list[dict[str, Any]]:
    port = free_port_pair()
    with tempfile.TemporaryDirectory() as ipc_dir:  # 0700
        env = {**os.environ, "PYTHONPATH": REPO, "BENCH_IPC_DIR": ipc_dir}
        procs = [
            subprocess.Popen(
                [python, __file__, mode, str(rank), str(size), str(port), *extra],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for rank in range(size)
        ]
        out = []
        for p in procs:
            stdout, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"{mode} rank exited with {p.returncode}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def worst(results: list[dict[str, Any]], kind: str, field: str) -> float:
    """The slowest rank's figure: every rank pays it in a synchronized loop."""
    return max(r[kind][field] for r in results)


def single_process(calls: int) -> dict[str, dict[str, float]]:
    sys.path.insert(0, REPO)
    from determined_launch.core import DistributedContext, PreemptContext

    dist = DistributedContext(
        rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
    )
    preempt = PreemptContext(dist)
    timed_calls(lambda: preempt.should_preempt(block=False), 2000)
    return {
        "nonblocking": stats(timed_calls(lambda: preempt.should_preempt(block=False), calls)),
        "blocking": stats(timed_calls(preempt.should_preempt, calls // 10)),
    }


def peer_python() -> str:
    script = os.path.join(REPO, "benchmarks", "peer_env.sh")
    return subprocess.run(
        ["bash", script], capture_output=True, text=True, check=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--blocking-calls", type=int, default=3000)
    args = parser.parse_args()

    solo = single_process(args.calls)
    ours = run_ranks(
        sys.executable, "ours", args.ranks, [str(args.calls), str(args.blocking_calls)]
    )
    peer = run_ranks(peer_python(), "peer", args.ranks, [str(args.blocking_calls)])

    rows = [
        ("ours, 1 process, block=False", solo["nonblocking"]),
        ("ours, 1 process, block=True", solo["blocking"]),
    ]
    for kind in ("nonblocking", "blocking"):
        rows.append(
            (
                f"ours, {args.ranks} ranks, block={kind == 'blocking'}",
                {f: worst(ours, kind, f) for f in ("median_us", "p99_us", "mean_us")},
            )
        )
    rows.append(
        (
            f"Determined 0.38.1, {args.ranks} ranks (blocking)",
            {f: worst(peer, "blocking", f) for f in ("median_us", "p99_us", "mean_us")},
        )
    )
    print(f"{'should_preempt(), nothing pending':46} {'median':>10} {'p99':>10} {'mean':>10}")
    for name, s in rows:
        print(f"{name:46} {s['median_us']:9.2f}us {s['p99_us']:9.2f}us {s['mean_us']:9.2f}us")
    peer = rows[-1][1]
    for field in ("median_us", "mean_us"):
        print(
            f"ratio to Determined ({field[:-3]} per call, {args.ranks} ranks): "
            f"block=False {rows[2][1][field] / peer[field]:.3f}, "
            f"block=True {rows[3][1][field] / peer[field]:.2f}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "ours":
        ours_worker(*(int(a) for a in sys.argv[2:7]))
    elif len(sys.argv) > 1 and sys.argv[1] == "peer":
        peer_worker(*(int(a) for a in sys.argv[2:6]))
    else:
        main()
