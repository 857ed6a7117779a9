"""What the system-metrics sampler (``core_context.profiler``) costs the training thread.

    python benchmarks/bench_profiler.py [--rounds 8] [--seconds 3] [--interval 1]

One process, a real ``core.init`` run directory. The training thread runs a
fixed amount of pure-Python work (``--seconds`` of it, measured once) in
blocks, alternately with the sampler off and on (``on(sampling_interval=
--interval)``; the Trainer's default is 1 s), ``--rounds`` pairs, the order
flipped each round so drift counts against both. Per block: the training
thread's CPU time (``time.thread_time``: neighbours' load and the sampler's own
thread are not counted) and its wall time (which does count the sampler's
turns on the GIL). Printed: each condition's median and the median paired
difference, in percent, as JSON; and ``sampler_cpu_us_per_sample``: the
sampler thread's own CPU per sample (at 0.1 s, with the main thread asleep),
the most it can take from training each second at the default 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def work(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def calibrate(seconds: float) -> int:
    n = 200_000
    start = time.thread_time()
    work(n)
    return max(1, int(n * seconds / max(time.thread_time() - start, 1e-6)))


def block(n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    work(n)
    return time.thread_time() - cpu, time.perf_counter() - wall


def median_pct(on: list[float], off: list[float]) -> float:
    return round(100 * statistics.median((a - b) / b for a, b in zip(on, off)), 2)


def sampler_cost(seconds: float = 5.0, interval: float = 0.1) -> float:
    """The sampler thread's CPU per sample (the process's CPU while this thread
    sleeps): an upper bound on what it can take from training, at 1 Hz, per second."""
    from determined_launch import core

    with tempfile.TemporaryDirectory() as tmp, core.init(run_dir=tmp) as ctx:
        time.sleep(0.5)
        idle = time.process_time()
        time.sleep(seconds)
        idle = time.process_time() - idle
        ctx.profiler.on(sampling_interval=interval, samples_per_report=10)
        time.sleep(0.5)
        cpu = time.process_time()
        time.sleep(seconds)
        cpu = time.process_time() - cpu
        ctx.profiler.off()
    return round((cpu - idle) / (seconds / interval) * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    from determined_launch import core

    n = calibrate(args.seconds)
    out: dict[str, Any] = {"interval_s": args.interval, "block_s": args.seconds,
                           "rounds": args.rounds}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    wall: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp, core.init(run_dir=tmp) as ctx:
        for r in range(args.rounds):
            for sampling in ((False, True) if r % 2 == 0 else (True, False)):
                if sampling:
                    ctx.profiler.on(sampling_interval=args.interval, samples_per_report=1)
                time.sleep(0.1)  # both: the sampler's thread has started and taken its baseline
                c, w = block(n)
                if sampling:
                    ctx.profiler.off()
                cpu[sampling].append(c)
                wall[sampling].append(w)
        reports = len((Path(tmp) / "profiler.jsonl").read_text().splitlines())
    for name, values in (("thread_cpu_s", cpu), ("wall_s", wall)):
        out[name] = {"off": round(statistics.median(values[False]), 4),
                     "on": round(statistics.median(values[True]), 4),
                     "paired_median_diff_pct": median_pct(values[True], values[False])}
    out["profiler_lines"] = reports
    out["sampler_cpu_us_per_sample"] = sampler_cost()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
