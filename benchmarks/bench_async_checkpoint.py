"""The training loop's pause for a checkpoint: synchronous vs asynchronous (issue 35 §4).

One run, the same 200 MB state (float32 tensors, like a model plus optimizer
buffers), two storages: a directory and S3 (a moto server on loopback).

- sync: ``store_path`` with ``torch.save`` inside: the loop waits for the
  write, the upload and the commit.
- async: ``snapshot.cpu_copy`` (the Trainer's consistent copy) then
  ``save_async``: the loop waits only for the copy; it then trains (in-place
  updates of the same tensors) while the save is written, uploaded and
  committed on its thread. ``steps during save`` counts those steps. As in
  the Trainer, the copy reuses the previous copy's buffers (an untimed save
  first allocates them; the table shows the first save's pause too).

The pause ratio (async / sync, median over reps; reps interleave sync and
async so both see the same machine load) has a target of at most 10 %.
Every async checkpoint is checked after its commit to hold the state as it
was copied, not as training changed it since.

    python benchmarks/bench_async_checkpoint.py [--size-mb 200] [--reps 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from determined_launch.core._context import _single_process  # noqa: E402
from determined_launch.core._rundir import RunDir  # noqa: E402
from determined_launch.core.checkpoint import CheckpointContext  # noqa: E402
from determined_launch.core.storage import open_storage, parse_storage  # noqa: E402
from determined_launch.core.storage.directory import DirectoryStorage  # noqa: E402
from determined_launch.pytorch.checkpoints.snapshot import cpu_copy  # noqa: E402

TENSORS = 20


def make_state(size_mb: int) -> dict[str, torch.Tensor]:
    n = (size_mb * 1_000_000) // (4 * TENSORS)
    gen = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(n, generator=gen) for i in range(TENSORS)}


def train_step(state: dict[str, torch.Tensor]) -> None:
    for t in state.values():
        t.mul_(0.999)


def sync_save(ctx: CheckpointContext, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    t0 = time.perf_counter()
    with ctx.store_path({"steps_completed": 1}) as (path, sid):
        torch.save(state, path / "state.pt")
    pause = time.perf_counter() - t0
    return {"pause_s": pause, "save_s": pause, "id": sid}


def async_save(ctx: CheckpointContext, state: dict[str, torch.Tensor],
               previous: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    copy = previous["copy"] = cpu_copy(state, reuse=previous.get("copy"))
    copied = time.perf_counter() - t0
    future = ctx.save_async(lambda path: torch.save(copy, path / "state.pt"),
                            {"steps_completed": 1})
    pause = time.perf_counter() - t0
    expected = {k: float(v[:4].sum()) for k, v in copy.items()}
    steps = 0
    while not future.done():
        train_step(state)
        steps += 1
    sid = ctx.wait()
    save = time.perf_counter() - t0
    assert sid == future.storage_id and ctx.backend.is_committed(sid)
    with ctx.restore_path(sid) as path:
        saved = torch.load(path / "state.pt", weights_only=True)
    got = {k: float(v[:4].sum()) for k, v in saved.items()}
    assert got == expected, "the checkpoint does not hold the state as it was copied"
    return {"pause_s": pause, "copy_s": copied, "save_s": save, "steps": steps, "id": sid}


def storages(work: pathlib.Path, endpoint: str) -> dict[str, CheckpointContext]:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing"
                 ).create_bucket(Bucket="bench")
    spec = parse_storage({"type": "s3", "bucket": "bench", "prefix": "async",
                          "endpoint_url": endpoint, "access_key": "testing",
                          "secret_key": "testing"}, where="bench")
    s3 = open_storage(spec)
    s3.list_ids()  # the client is built outside the timing
    (work / "ckpt").mkdir()
    out: dict[str, CheckpointContext] = {}
    for name, backend in (("directory", DirectoryStorage(work / "ckpt")), ("s3 (moto)", s3)):
        out[name] = CheckpointContext(_single_process(), backend,
                                      RunDir(work / f"run-{len(out)}", trial_id=None))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()

    from benchmarks.bench_storage import start_moto
    from tests.conftest import free_port_block

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-async-ckpt-"))
    port = free_port_block(1)
    server = start_moto(port, work)
    state = make_state(args.size_mb)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    print(f"state {args.size_mb} MB in {TENSORS} tensors; {args.reps} reps; load average "
          f"{os.getloadavg()[0]:.1f}; torch {torch.__version__}", flush=True)
    try:
        for name, ctx in storages(work, f"http://127.0.0.1:{port}").items():
            previous: dict[str, Any] = {}  # the Trainer reuses its last copy's buffers
            first = async_save(ctx, state, previous)  # allocates them: reported, not in the ratio
            ctx.delete(first["id"])
            runs = results.setdefault(name, {"sync": [], "async": [], "first async": [first]})
            for rep in range(args.reps):
                order = ("sync", "async") if rep % 2 == 0 else ("async", "sync")
                for mode in order:
                    run = (sync_save(ctx, state) if mode == "sync"
                           else async_save(ctx, state, previous))
                    runs[mode].append(run)
                    ctx.delete(run["id"])
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'storage':<11} {'sync pause s':>12} {'async pause s':>13} {'ratio':>6} "
          f"{'async save s':>12} {'steps during save':>17} {'first async pause s':>19}")
    for name, runs in results.items():
        sync = statistics.median(r["pause_s"] for r in runs["sync"])
        pause = statistics.median(r["pause_s"] for r in runs["async"])
        save = statistics.median(r["save_s"] for r in runs["async"])
        steps = statistics.median(r["steps"] for r in runs["async"])
        first = runs["first async"][0]["pause_s"]
        print(f"{name:<11} {sync:>12.3f} {pause:>13.3f} {pause / sync:>6.1%} {save:>12.3f} "
              f"{steps:>17.0f} {first:>19.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
