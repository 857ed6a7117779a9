"""allgather latency, ours vs Determined 0.38.1, interleaved inside the same processes.

    python benchmarks/bench_distributed_paired.py --sizes 2 4 8 --blocks 60 --per-block 25

Why a second benchmark: ``bench_distributed.py`` alternates whole runs, a
few seconds each, and on a 2-core machine shared with other sessions the
load changes within seconds, so its per-round ratios at 8 ranks spread from
0.4x to 1.5x. Here every worker process (the peer virtualenv's interpreter,
which imports both packages) holds both contexts at once and alternates
*blocks* of ``--per-block`` allgathers between them, ABBA order, so the two
implementations are compared tens of milliseconds apart under the same load.
The ratio reported is the median over blocks of (our block p50 /
Determined's adjacent block p50); the spread of those block ratios (p25 -
p75) says how noisy the machine was.

Same calls as ``bench_distributed.py``: ``allgather({"rank": r, "step": i})``
timed on rank 0; ours with a secret (HMAC-SHA256 on every frame) over Unix
sockets in a private 0700 directory, as our launchers run it, and
``ours-tcp`` over loopback TCP (Determined's chief always listens on TCP).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_distributed import free_port, peer_python  # noqa: E402

IMPLS = ("ours", "ours-tcp", "determined")


def _contexts(a: argparse.Namespace) -> dict[str, Any]:
    from determined.core import DistributedContext as DetContext

    from determined_launch.core import DistributedContext

    layout = dict(
        rank=a.rank, size=a.size, local_rank=a.rank, local_size=a.size, cross_rank=0, cross_size=1
    )
    out: dict[str, Any] = {}
    # Created in the same order on every rank: each constructor is a barrier.
    for impl in a.impls:
        if impl == "determined":
            out[impl] = DetContext(
                **layout, chief_ip="127.0.0.1", pub_port=a.port + 2, pull_port=a.port + 3
            )
        else:
            tcp = impl == "ours-tcp"
            out[impl] = DistributedContext(
                **layout, port=a.port + tcp, secret=a.secret, ipc_dir=a.ipc_dir, force_tcp=tcp
            )
    return out


def worker(a: argparse.Namespace) -> None:
    ctxs = _contexts(a)
    clock = time.perf_counter
    times: dict[str, list[list[float]]] = {impl: [] for impl in a.impls}
    step = 0
    for block in range(a.warmup_blocks + a.blocks):
        order = list(a.impls) if block % 2 == 0 else list(reversed(a.impls))
        for impl in order:
            ctx = ctxs[impl]
            got: list[float] = []
            for _ in range(a.per_block):
                t0 = clock()
                out = ctx.allgather({"rank": a.rank, "step": step})
                got.append(clock() - t0)
                step += 1
                if len(out) != a.size or out[-1]["rank"] != a.size - 1:
                    raise SystemExit(f"{impl}: bad allgather result {out!r}")
            if block >= a.warmup_blocks:
                times[impl].append(got)
    for ctx in ctxs.values():
        ctx.close()
    if a.rank == 0:
        print(json.dumps(times))


def run(size: int, args: argparse.Namespace) -> dict[str, list[list[float]]]:
    port = free_port(4)
    common = [
        "--size", str(size), "--port", str(port), "--secret", secrets.token_hex(16),
        "--blocks", str(args.blocks), "--per-block", str(args.per_block),
        "--warmup-blocks", str(args.warmup_blocks), "--impls", *args.impls,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as ipc_dir:
        os.chmod(ipc_dir, 0o700)
        env = dict(os.environ, PYTHONPATH=ROOT)
        procs = [
            subprocess.Popen(
                [args.peer_python, __file__, "--worker", "--rank", str(r), "--ipc-dir", ipc_dir,
                 *common],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            for r in range(size)
        ]
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"size {size} failed ({p.returncode}):\n{err[-3000:]}")
    times: dict[str, list[list[float]]] = json.loads(outs[0][0].strip().splitlines()[-1])
    return times


def p50(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def summarize(size: int, times: dict[str, list[list[float]]]) -> dict[str, Any]:
    det = [p50(b) for b in times["determined"]]
    row: dict[str, Any] = {"size": size}
    for impl, blocks in times.items():
        flat = sorted(t for b in blocks for t in b)
        ratios = sorted(p50(b) / d for b, d in zip(blocks, det))
        q = statistics.quantiles(ratios, n=4)
        row[impl] = {
            "p50_us": p50(flat),
            "p90_us": flat[int(0.9 * len(flat))] * 1e6,
            "ratio": statistics.median(ratios),
            "ratio_p25": q[0],
            "ratio_p75": q[2],
            "calls": len(flat),
        }
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--size", type=int, default=2)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--secret", default=None)
    p.add_argument("--ipc-dir", default=None)
    p.add_argument("--sizes", type=int, nargs="*", default=[2, 4, 8])
    p.add_argument("--impls", nargs="+", default=list(IMPLS))
    p.add_argument("--blocks", type=int, default=60, help="timed blocks per implementation")
    p.add_argument("--per-block", type=int, default=25, help="allgathers per block")
    p.add_argument("--warmup-blocks", type=int, default=4)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=os.path.join(HERE, "results-distributed-paired.json"))
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if "determined" not in args.impls:
        raise SystemExit("--impls must include determined (the ratios are against it)")
    args.peer_python = peer_python()
    rows = []
    load_at_start = os.getloadavg()
    for size in args.sizes:
        row = summarize(size, run(size, args))
        rows.append(row)
        for impl in args.impls:
            r = row[impl]
            print(
                f"{impl:>10} n={size:<2} allgather p50 {r['p50_us']:6.0f} us  p90 "
                f"{r['p90_us']:6.0f} us | vs determined {r['ratio']:.2f}x "
                f"(blocks p25-p75 {r['ratio_p25']:.2f}-{r['ratio_p75']:.2f})",
                flush=True,
            )
    machine = {
        "cpus": os.cpu_count(),
        "load_at_start": load_at_start,
        "load_at_end": os.getloadavg(),
    }
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "machine": machine, "args": vars(args)}, f, indent=1)
    print(f"wrote {args.out}; load average {load_at_start[0]:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
