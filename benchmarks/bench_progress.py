"""Cost of the progress beacon (``core/_progress.py``) on the training thread,
and of the launcher's once-a-second read (``supervisor/watchdog.py``).

    python benchmarks/bench_progress.py [--steps 200000] [--rounds 7] [--work-us 0]

One process, one run: a Core API loop (``core.init()``, one
``should_preempt(block=False)`` per step, ``--work-us`` of busy work per step)
timed in alternating rounds with the beacon on (as under ``det-launch``: a
status directory) and off (as a bare script). Printed: the median over rounds
of ns per step for each, and the difference; then the launcher's
``Watchdog.poll`` over 8 ranks' progress files (µs per poll, once a second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from determined_launch import envvars  # noqa: E402
from determined_launch.core import _progress  # noqa: E402


def loop(ctx: object, steps: int, work_ns: int) -> float:
    """ns per step of the loop."""
    should_preempt = ctx.preempt.should_preempt  # type: ignore[attr-defined]
    perf = time.perf_counter_ns
    start = perf()
    for _ in range(steps):
        if work_ns:
            until = perf() + work_ns
            while perf() < until:
                pass
        should_preempt(block=False)
    return (perf() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--work-us", type=float, default=0.0)
    args = p.parse_args()
    import determined_launch as det

    with tempfile.TemporaryDirectory() as tmp:
        status_dir = os.path.join(tmp, "status")
        os.mkdir(status_dir)
        env = {envvars.WRAP_RANK_STATUS_DIR: status_dir}
        os.environ[envvars.RUN_DIR] = os.path.join(tmp, "run")  # nothing left in ./det_runs
        with det.core.init(checkpoint_storage=os.path.join(tmp, "ck")) as ctx:
            _progress.stop()  # on and off by hand below, inside the one context
            on: list[float] = []
            off: list[float] = []
            loop(ctx, args.steps // 10, int(args.work_us * 1e3))  # warm up
            for _ in range(args.rounds):
                _progress.start(0, env)
                on.append(loop(ctx, args.steps, int(args.work_us * 1e3)))
                _progress.stop()
                off.append(loop(ctx, args.steps, int(args.work_us * 1e3)))
        # the launcher's side: 8 ranks' files, read once a second
        from determined_launch.supervisor.watchdog import Watchdog

        beacons = [_progress.Beacon(status_dir, r) for r in range(8)]
        for b in beacons:
            b.beat(1)
        dog = Watchdog(status_dir, timeout=3600.0)
        polls = []
        for i in range(200):
            t0 = time.perf_counter_ns()
            dog.poll(float(i), time.time(), done=())
            polls.append(time.perf_counter_ns() - t0)
        for b in beacons:
            b.close()
    result = {
        "steps_per_round": args.steps, "rounds": args.rounds, "work_us": args.work_us,
        "off_ns_per_step": statistics.median(off), "on_ns_per_step": statistics.median(on),
        "diff_ns_per_step": statistics.median(on) - statistics.median(off),
        "off_rounds": [round(x, 1) for x in off], "on_rounds": [round(x, 1) for x in on],
        "watchdog_poll_8_ranks_us": statistics.median(polls) / 1e3,
        "load": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
