"""DistributedContext latency: ours vs Determined 0.38.1 vs torch gloo, same run.

    python benchmarks/bench_distributed.py                 # 2, 4, 8 ranks + 64-rank run
    python benchmarks/bench_distributed.py --sizes 2 4 --iters 300 --no-64

Every implementation runs as N real processes on this host. Per size, each
process does ``--warmup`` untimed collectives, then ``--iters`` timed ones:

- allgather: ``allgather({"rank": r, "step": i})``, a round trip by nature
  (every rank's contribution goes to the chief and the result comes back);
- broadcast round trip: the chief broadcasts a small dict, every rank
  answers with ``gather``; the chief times both. What each worker gathers
  is its one-way receive latency (same host, so ``time.perf_counter`` is
  one clock), reported as "bcast 1-way". (Determined's gather also makes
  every worker wait for an acknowledgement; ours does not.)

Rank 0's per-iteration times give p50/p90. Ours runs with authentication on
(a secret is set) and ipc:// in a private directory, as our launchers run
it; the "ours-tcp" row forces loopback TCP for an even comparison with
Determined, whose chief always listens on TCP; "ours-zmq" is our ZeroMQ
transport. Implementations take turns, a round at a time, and ratios are
medians of per-round ratios, so that the drifting load of this shared
machine weighs on all of them alike. gloo uses
``all_gather_object`` and ``broadcast_object_list`` + ``gather_object``.

The Determined rows run in the peer virtualenv (``benchmarks/peer_env.sh``);
the plot needs matplotlib, taken from that virtualenv (it is a dependency
of ``determined``), so this project gains no dependency for it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ----------------------------------------------------------------- workers
def _make_context(impl: str, a: argparse.Namespace) -> Any:
    rank, size = a.rank, a.size
    local_size = size // a.nodes
    layout = dict(
        rank=rank,
        size=size,
        local_rank=rank % local_size,
        local_size=local_size,
        cross_rank=rank // local_size,
        cross_size=a.nodes,
    )
    if impl.startswith("ours"):
        from determined_launch.core import DistributedContext

        return DistributedContext(
            **layout,
            chief_ip="127.0.0.1",
            port=a.port,
            secret=a.secret,
            ipc_dir=a.ipc_dir,
            force_tcp=impl == "ours-tcp",
            hierarchical=impl == "ours-hier",
            transport="zmq" if impl == "ours-zmq" else "direct",
        )
    if impl == "determined":
        from determined.core import DistributedContext as DetContext

        return DetContext(**layout, chief_ip="127.0.0.1", pub_port=a.port, pull_port=a.port + 1)
    raise SystemExit(f"unknown impl {impl}")


class _Gloo:
    """The same three calls over torch.distributed object collectives."""

    def __init__(self, a: argparse.Namespace) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = a.rank
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.size
        )

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.dist.get_world_size()
        self.dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> Any:
        out: Any = [None] * self.dist.get_world_size() if self.rank == 0 else None
        self.dist.gather_object(obj, out, dst=0)
        return out

    def close(self) -> None:
        self.dist.destroy_process_group()


def _preimport(impl: str) -> None:
    """Import the implementation before the clock starts: "init" measures
    connecting, not importing."""
    if impl == "gloo":
        import torch.distributed  # noqa: F401
    elif impl == "determined":
        import determined.core  # noqa: F401
    else:
        import determined_launch.core  # noqa: F401


def worker(a: argparse.Namespace) -> None:
    _preimport(a.impl)
    t_start = time.time()
    ctx = _Gloo(a) if a.impl == "gloo" else _make_context(a.impl, a)
    t_ready = time.time()
    rank = a.rank
    ag: list[float] = []
    bc: list[float] = []
    oneway: list[float] = []
    clock = time.perf_counter
    for i in range(a.warmup + a.iters):
        t0 = clock()
        out = ctx.allgather({"rank": rank, "step": i})
        t1 = clock()
        if i >= a.warmup:
            ag.append(t1 - t0)
        if len(out) != a.size or out[-1]["rank"] != a.size - 1:
            raise SystemExit(f"bad allgather result {out!r}")
    for i in range(0 if a.no_bcast else a.warmup + a.iters):
        t0 = clock()
        got = ctx.broadcast({"step": i, "sent": t0} if rank == 0 else None)
        acks = ctx.gather(clock() - got["sent"])
        t1 = clock()
        if i >= a.warmup and rank == 0:
            bc.append(t1 - t0)
            oneway.append(max(acks[1:]))
    if a.impl != "gloo":
        dropped = getattr(ctx, "dropped_frames", 0)
    else:
        dropped = 0
    ctx.close()
    if rank == 0:
        print(
            json.dumps(
                {"allgather": ag, "bcast_rt": bc, "bcast_1way": oneway, "dropped": dropped}
            )
        )
    print(json.dumps({"rank": rank, "start": t_start, "ready": t_ready}), file=sys.stderr)


# ------------------------------------------------------------------ driver
def free_port(span: int = 2) -> int:
    """A port p with p..p+span-1 free right now (Determined needs two)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + span > 65535:
            continue
        ok = True
        for extra in range(1, span):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + extra))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port range")


def peer_python() -> str:
    out = subprocess.run(
        ["bash", os.path.join(HERE, "peer_env.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def run(
    impl: str, size: int, args: argparse.Namespace, nodes: int = 1, iters: int | None = None
) -> dict[str, Any]:
    python = args.peer_python if impl == "determined" else sys.executable
    port = free_port(2)
    secret = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as ipc_dir:
        os.chmod(ipc_dir, 0o700)
        env = dict(os.environ, PYTHONPATH=ROOT)
        common = [
            "--impl", impl, "--size", str(size), "--nodes", str(nodes), "--port", str(port),
            "--secret", secret, "--ipc-dir", ipc_dir, "--warmup", str(args.warmup),
            "--iters", str(iters or args.iters),
        ]  # fmt: skip
        if iters is not None:
            common.append("--no-bcast")
        t0 = time.time()
        procs = [
            subprocess.Popen(
                [python, __file__, "--worker", "--rank", str(r), *common],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(size)
        ]
        outs = [p.communicate(timeout=args.timeout) for p in procs]
        wall = time.time() - t0
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{impl} size {size} failed ({p.returncode}):\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(outs[0][0].strip().splitlines()[-1])
    stamps = [json.loads(err.strip().splitlines()[-1]) for _, err in outs]
    result["init_s"] = max(s["ready"] for s in stamps) - max(s["start"] for s in stamps)
    result["wall_s"] = wall
    return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="ours")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--size", type=int, default=2)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--secret", default=None)
    p.add_argument("--ipc-dir", default=None)
    p.add_argument("--no-bcast", action="store_true")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--iters", type=int, default=200, help="timed iterations per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="*", default=[2, 4, 8])
    p.add_argument(
        "--impls", nargs="+", default=["ours", "ours-tcp", "ours-zmq", "determined", "gloo"]
    )
    p.add_argument("--no-64", action="store_true", help="skip the 64-rank run")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=os.path.join(HERE, "results-distributed.json"))
    p.add_argument("--plot", default=os.path.join(HERE, "bench_distributed.png"))
    p.add_argument("--plot-only", action="store_true", help="redraw --plot from --out")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.plot_only:
        args.peer_python = peer_python()
        with open(args.out) as f:
            plot(args, json.load(f)["rows"])
        return
    args.peer_python = peer_python()
    load_at_start = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        # Implementations take turns, a round at a time, so that the load of
        # this shared machine, which drifts, weighs on all of them alike.
        samples: dict[str, dict[str, list[float]]] = {}
        round_p50: dict[str, list[tuple[float, float]]] = {}
        for k in range(args.rounds):
            # gloo is 10-40x slower and its 8 torch imports load the machine:
            # one round of it, last, is plenty and spares the others' rounds.
            fast = [i for i in args.impls if i != "gloo"]
            order = fast if k % 2 == 0 else fast[::-1]
            if k == args.rounds - 1 and "gloo" in args.impls:
                order = [*order, "gloo"]
            for impl in order:
                r = run(impl, size, args)
                acc = samples.setdefault(
                    impl, {"allgather": [], "bcast_rt": [], "bcast_1way": [], "dropped": []}
                )
                for key in ("allgather", "bcast_rt", "bcast_1way"):
                    acc[key] += r[key]
                acc["dropped"].append(r["dropped"])
                round_p50.setdefault(impl, []).append(
                    (pct(r["allgather"], 0.5), pct(r["bcast_rt"], 0.5))
                )
        for impl, r in samples.items():
            row = {
                "impl": impl,
                "size": size,
                "n": len(r["allgather"]),
                "ag_p50": pct(r["allgather"], 0.5),
                "ag_p90": pct(r["allgather"], 0.9),
                "bc_p50": pct(r["bcast_rt"], 0.5),
                "bc_p90": pct(r["bcast_rt"], 0.9),
                "bc1_p50": pct(r["bcast_1way"], 0.5),
                "dropped": sum(r["dropped"]),
            }
            rows.append(row)
            print(
                f"{impl:>10} n={size:<2} allgather p50 {row['ag_p50']:6.0f} us  p90 "
                f"{row['ag_p90']:6.0f} us | bcast rt p50 {row['bc_p50']:6.0f} us  p90 "
                f"{row['bc_p90']:6.0f} us | bcast 1-way p50 {row['bc1_p50']:6.0f} us",
                flush=True,
            )
        base = next((r for r in rows if r["size"] == size and r["impl"] == "determined"), None)
        if base is not None:
            # Ratios per round (same minute, same load), then their median:
            # robust to the load of this shared machine drifting between rounds.
            det = round_p50["determined"]
            for row in rows:
                if row["size"] != size:
                    continue
                mine = round_p50[row["impl"]]
                pairs = list(zip(mine, det[-len(mine) :]))  # gloo: its one round, the last
                row["ag_ratio"] = statistics.median(m[0] / d[0] for m, d in pairs)
                row["bc_ratio"] = statistics.median(m[1] / d[1] for m, d in pairs)
                row["ag_ratios"] = [round(m[0] / d[0], 2) for m, d in pairs]
            print(
                "    p50 vs determined (median of per-round ratios): "
                + ", ".join(
                    f"{r['impl']} allgather {r['ag_ratio']:.2f}x bcast {r['bc_ratio']:.2f}x"
                    for r in rows
                    if r["size"] == size and r["impl"] != "determined"
                ),
                flush=True,
            )
    big: list[dict[str, Any]] = []
    if not args.no_64:
        for impl, nodes in (("ours", 1), ("ours", 8), ("ours-hier", 8), ("determined", 1)):
            r = run(impl, 64, args, nodes=nodes, iters=100)
            entry = {
                "impl": impl,
                "nodes": nodes,
                "init_s": r["init_s"],
                "allgather_100_s": sum(r["allgather"]),
                "ag_p50": pct(r["allgather"], 0.5),
                "wall_s": r["wall_s"],
            }
            big.append(entry)
            print(
                f"64 ranks {impl:>10} as {nodes} node(s): init {entry['init_s']:.3f} s, 100 "
                f"allgathers {entry['allgather_100_s']:.3f} s (p50 {entry['ag_p50']:.0f} us), "
                f"wall {entry['wall_s']:.1f} s",
                flush=True,
            )
    with open(args.out, "w") as f:
        machine = {
            "cpus": os.cpu_count(),
            "kernel": os.uname().release,
            "load_at_end": os.getloadavg(),
            "load_at_start": load_at_start,
        }
        json.dump({"rows": rows, "64": big, "machine": machine}, f, indent=1)
    if rows:
        plot(args, rows)


def plot(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Draw with the peer venv's matplotlib (a subprocess, so no import here)."""
    code = r"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = json.load(open(sys.argv[1]))["rows"]
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
for ax, key, title in ((axes[0], "ag", "allgather (round trip)"),
                       (axes[1], "bc", "broadcast, then gather (round trip)")):
    for k, impl in enumerate(dict.fromkeys(r["impl"] for r in rows)):
        rs = [r for r in rows if r["impl"] == impl]
        xs = [r["size"] for r in rs]
        c = colors[k % len(colors)]
        ax.plot(xs, [r[key + "_p50"] for r in rs], marker="o", color=c, label=impl + " p50")
        ax.plot(xs, [r[key + "_p90"] for r in rs], ls="--", color=c, alpha=.5,
                label=impl + " p90")
    ax.set_yscale("log"); ax.set_xscale("log", base=2)
    ax.set_xticks(xs); ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("ranks (processes, one 2-core host)"); ax.set_ylabel("latency (us)")
    ax.set_title(title); ax.grid(True, which="both", alpha=.3)
axes[1].legend(fontsize=7, ncol=2)
fig.tight_layout(); fig.savefig(sys.argv[2], dpi=110)
"""
    subprocess.run([args.peer_python, "-c", code, args.out, args.plot], check=True)
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
