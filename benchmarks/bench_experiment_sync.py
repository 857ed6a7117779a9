"""What an experiment's page in object storage costs (experiment/sync.py, ui/remote.py).

    python benchmarks/bench_experiment_sync.py [--trials 10000] [--reps 3]

On a moto S3 server on loopback: an experiment of ``--trials`` finished
trials in a journal study (bench_ui.py's fixture) is

* **uploaded** by ``ExperimentSync``: the journal (copied up to its last
  newline, one PUT) then ``experiment.json``; then again after a heartbeat
  line was appended (what the driver's periodic upload costs: the journal
  whole each time, as object stores cannot append);
* **mirrored** by ``det-launch ui``'s ``Mirror``: the first sync (the journal
  fetched whole) and a sync after the append (one ranged GET of the new bytes).

Wall time and this process's CPU time (``time.process_time``; the uploads
and fetches run in this process) for each, the median over ``--reps``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_storage import start_moto  # noqa: E402
from benchmarks.bench_ui import build_experiment  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import boto3

    from determined_launch.core.storage import open_storage, parse_storage
    from determined_launch.experiment.sync import ExperimentSync
    from determined_launch.ui.remote import Mirror

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-exp-sync-"))
    port = free_port()
    moto = start_moto(port, work)
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
        s3.create_bucket(Bucket="bench-exp")
        build_experiment(work, args.trials)
        exp = work / "det_experiments" / "big"
        journal = exp / "study.journal"
        put = open_storage(parse_storage("s3://bench-exp/p", where="bench")).put_extra
        beat = json.dumps({"op_code": 8, "worker_id": "w", "trial_id": 0,
                           "user_attr": {"det_heartbeat": 1.0}}) + "\n"
        rows: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.reps):
            sync = ExperimentSync(exp, journal, put)
            upload = functools.partial(sync.sync, journal=True, logs=False)
            rows.setdefault("upload first (journal + record)", []).append(timed(upload))
            with open(journal, "a") as f:
                f.write(beat)
            rows.setdefault("upload after a heartbeat (journal whole)", []).append(
                timed(upload))
            sync.close()
            mirror = Mirror("s3://bench-exp/p")
            rows.setdefault("mirror first sync (journal fetched)", []).append(
                timed(mirror.first_sync))
            with open(journal, "a") as f:
                f.write(beat)
            sync = ExperimentSync(exp, journal, put)
            sync.sync(journal=True, logs=False)
            sync.close()
            rows.setdefault("mirror sync after an append (ranged GET)", []).append(
                timed(mirror.sync))
            mirror.close()
        size = journal.stat().st_size
        print(f"{args.trials} trials, journal {size / 2**20:.1f} MiB, median of {args.reps}")
        for name, values in rows.items():
            wall = statistics.median(v[0] for v in values)
            cpu = statistics.median(v[1] for v in values)
            print(f"  {name}: {wall:.3f} s wall, {cpu:.3f} s CPU")
    finally:
        moto.terminate()
        moto.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
