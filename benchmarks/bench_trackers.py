"""What ``--report-to mlflow,wandb`` costs the training thread, per report.

    python benchmarks/bench_trackers.py [--reports 2000] [--work-ms 1]

Real trackers in this process: MLflow on its local file store, W&B offline,
each behind its sink's thread (core/trackers/). Measured on the training
thread only:

* ``Trackers.report`` alone: wall time per call (median, p99) and this
  thread's CPU time per call (``time.thread_time``, so neighbours' load and
  the trackers' own threads are not counted);
* the same for an empty call (the timers' own cost, to subtract);
* ``block``: this thread's CPU for all reports back to back, divided by
  their number (no per-call timer in it);
* ``process_cpu_us``: the whole process's CPU per report while reporting
  (``time.process_time``, the ``--work-ms`` work included: subtract the
  empty call's figure), the trackers' threads included: what the trackers
  cost the machine, not the training thread;
* ``report_training_metrics`` (the run directory's JSON line, the log line,
  TensorBoard when installed) with trackers off and on.

``--work-ms``: busy CPU work between reports (a training step), so the
trackers' threads deliver while training runs, as in a real job; ``0`` is
back-to-back reports, the worst case for the queue.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

METRICS = {"loss": 0.5, "accuracy": 0.9, "lr": 1e-3, "grad_norm": 2.0, "tokens": 4096}


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def summary(wall_ns: list[int], cpu_ns: int) -> dict[str, float]:
    s = sorted(wall_ns)
    return {"median_us": round(statistics.median(s) / 1e3, 2),
            "p99_us": round(s[int(len(s) * 0.99)] / 1e3, 2),
            "cpu_us": round(cpu_ns / len(s) / 1e3, 2)}


def timed(call: Any, reports: int, work_ms: float) -> dict[str, float]:
    wall: list[int] = []
    cpu = 0
    p0 = time.process_time_ns()
    for step in range(1, reports + 1):
        busy(work_ms)
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        call(step)
        wall.append(time.perf_counter_ns() - t0)
        cpu += time.thread_time_ns() - c0
    out = summary(wall, cpu)
    # the busy work included: compare with the empty call's figure
    out["process_cpu_us"] = round((time.process_time_ns() - p0) / reports / 1e3, 1)
    c0 = time.thread_time_ns()
    for step in range(reports + 1, 2 * reports + 1):
        call(step)
    out["block_cpu_us"] = round((time.thread_time_ns() - c0) / reports / 1e3, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reports", type=int, default=2000)
    p.add_argument("--work-ms", type=float, default=1.0)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-trackers-"))
    os.environ.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp}/mlflow.db", WANDB_MODE="offline",
                      WANDB_SILENT="true", MLFLOW_EXPERIMENT_NAME="bench")
    from determined_launch import core
    from determined_launch.core import trackers

    out: dict[str, Any] = {"reports": args.reports, "work_ms": args.work_ms,
                           "metrics_per_report": len(METRICS)}
    out["empty call"] = timed(lambda s: None, args.reports, args.work_ms)
    who = trackers.identity(tmp / "alone", 1, {"lr": 1e-3})
    sink = trackers.open_trackers(["mlflow", "wandb"], who, resuming=False)
    assert sink is not None
    time.sleep(15)  # let the clients start (their import is a one-time cost on their thread)
    out["Trackers.report (mlflow+wandb)"] = timed(
        lambda s: sink.report("training", s, METRICS), args.reports, args.work_ms)
    t0 = time.perf_counter()
    sink.close("completed")
    out["close_s"] = round(time.perf_counter() - t0, 2)

    for label, report_to in (("report_training_metrics, trackers off", ""),
                             ("report_training_metrics, mlflow+wandb", "mlflow,wandb")):
        os.environ["DET_REPORT_TO"] = report_to
        run_dir = tmp / (report_to.replace(",", "-") or "off")
        with core.init(run_dir=str(run_dir), checkpoint_storage=str(tmp / "ckpt")) as ctx:
            time.sleep(1)
            out[label] = timed(lambda s: ctx.train.report_training_metrics(s, METRICS),
                               args.reports, args.work_ms)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
