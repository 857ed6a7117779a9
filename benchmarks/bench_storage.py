"""Checkpoint upload/download against S3: ours vs s3fs put/get vs boto3's
transfer manager, on the same moto server (a separate process on loopback).

    python benchmarks/bench_storage.py [--size-mb 1024] [--reps 1]

Two layouts of the same total size: 64 files, and 1 file. "ours" is
``CheckpointContext.upload`` (parallel uploads, multipart for large files,
size check of every file, then the commit marker) and ``download``
(requires the marker, then parallel downloads). Reps are interleaved, so
the three tools see the same machine load; the figure is the median.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from determined_launch.core._context import _single_process  # noqa: E402
from determined_launch.core._rundir import RunDir  # noqa: E402
from determined_launch.core.checkpoint import CheckpointContext  # noqa: E402
from determined_launch.core.storage import open_storage, parse_storage  # noqa: E402
from tests.storage_servers import wait_port  # noqa: E402

KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def make_files(root: pathlib.Path, total: int, count: int) -> None:
    root.mkdir(parents=True)
    size = total // count
    chunk = os.urandom(1 << 20)
    for i in range(count):
        with open(root / f"part-{i:03d}.bin", "wb") as f:
            left = size
            while left > 0:
                f.write(chunk[:min(left, len(chunk))])
                left -= len(chunk)


def start_moto(port: int, workdir: pathlib.Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir)
    wait_port(port, 30)
    return proc


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()

    import boto3

    from tests.conftest import free_port_block

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-storage-"))
    port = free_port_block(1)
    server = start_moto(port, work)
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **KEYS)
    client.create_bucket(Bucket="bench")
    total = args.size_mb << 20
    results: dict[tuple[str, str, str], list[float]] = {}
    try:
        for count in (64, 1):
            src = work / f"src-{count}"
            make_files(src, total, count)
            os.sync()  # no write-back of the source files during the first timed run
            layout = f"{count} file{'s' if count > 1 else ''}"
            for rep in range(args.reps):
                order = ("ours", "s3fs", "boto3")
                for tool in order[rep % 3:] + order[:rep % 3]:  # no tool always first
                    dst = work / "dst"
                    shutil.rmtree(dst, ignore_errors=True)
                    prefix = f"{tool}-{count}-{rep}"
                    up, down = with_retry(tool, functools.partial(
                        round_trip, tool, client, endpoint, work, src, dst, prefix))
                    results.setdefault((layout, "upload", tool), []).append(up)
                    results.setdefault((layout, "download", tool), []).append(down)
                    got = sum(p.stat().st_size for p in dst.rglob("*.bin"))
                    if got != (total // count) * count:
                        raise RuntimeError(f"{tool}: downloaded {got} bytes, expected {total}")
                    print(f"{layout:8} rep {rep} {tool:5}  up {up:6.2f} s  down {down:6.2f} s",
                          flush=True)
                    empty_prefix(client, prefix)  # bound the server's memory
            shutil.rmtree(src)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    report(results, args.size_mb)


def empty_prefix(client: Any, prefix: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket="bench", Delete={"Objects": keys})


def round_trip(tool: str, client: Any, endpoint: str, work: pathlib.Path, src: pathlib.Path,
               dst: pathlib.Path, prefix: str) -> tuple[float, float]:
    shutil.rmtree(dst, ignore_errors=True)
    empty_prefix(client, prefix)
    if tool == "ours":
        return ours_round_trip(endpoint, work, src, dst, prefix)
    if tool == "s3fs":
        return s3fs_round_trip(endpoint, src, dst, prefix)
    return boto3_round_trip(client, src, dst, prefix)


def with_retry(tool: str, fn: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """moto on a loaded 2-core machine sometimes answers 500 to a 1 GB
    CompleteMultipartUpload; such a run is repeated (and said so), for every tool."""
    for attempt in range(3):
        try:
            return fn()
        except Exception as e:
            print(f"  {tool}: attempt {attempt + 1} failed ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120]}); repeating", flush=True)
    raise RuntimeError(f"{tool}: failed 3 times")


def ours_round_trip(endpoint: str, work: pathlib.Path, src: pathlib.Path, dst: pathlib.Path,
                    prefix: str) -> tuple[float, float]:
    spec = parse_storage({"type": "s3", "bucket": "bench", "prefix": prefix,
                          "endpoint_url": endpoint, "access_key": "testing",
                          "secret_key": "testing"}, where="bench")
    backend = open_storage(spec)
    backend.list_ids()  # warm: the client is built outside the timing
    ctx = CheckpointContext(_single_process(), backend, RunDir(work / "run", trial_id=None))
    sid: list[str] = []
    up = timed(lambda: sid.append(ctx.upload(src, {})))
    return up, timed(lambda: ctx.download(sid[0], dst))


def s3fs_round_trip(endpoint: str, src: pathlib.Path, dst: pathlib.Path,
                    prefix: str) -> tuple[float, float]:
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint,
                           skip_instance_cache=True)
    fs.ls("bench")  # warm, as for ours
    up = timed(lambda: fs.put(str(src) + "/", f"bench/{prefix}/", recursive=True))
    return up, timed(lambda: fs.get(f"bench/{prefix}/", str(dst) + "/", recursive=True))


def boto3_round_trip(client: Any, src: pathlib.Path, dst: pathlib.Path,
                     prefix: str) -> tuple[float, float]:
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    config = TransferConfig()

    files = sorted(p for p in src.iterdir())

    def upload() -> None:
        with create_transfer_manager(client, config) as tm:
            futures = [tm.upload(str(p), "bench", f"{prefix}/{p.name}") for p in files]
            for f in futures:
                f.result()

    def download() -> None:
        dst.mkdir(parents=True, exist_ok=True)
        with create_transfer_manager(client, config) as tm:
            futures = [tm.download("bench", f"{prefix}/{p.name}", str(dst / p.name))
                       for p in files]
            for f in futures:
                f.result()

    return timed(upload), timed(download)


def report(results: dict[tuple[str, str, str], list[float]], size_mb: int) -> None:
    print(f"\n| layout ({size_mb} MB) | direction | ours s | s3fs s | boto3 s | "
          "ours MB/s | ours / faster peer (speed) |")
    print("|---|---|---|---|---|---|---|")
    for layout in ("64 files", "1 file"):
        for direction in ("upload", "download"):
            med = {t: statistics.median(results[(layout, direction, t)])
                   for t in ("ours", "s3fs", "boto3")}
            faster = min(med["s3fs"], med["boto3"])
            print(f"| {layout} | {direction} | {med['ours']:.2f} | {med['s3fs']:.2f} | "
                  f"{med['boto3']:.2f} | {size_mb / med['ours']:.0f} | "
                  f"{faster / med['ours']:.2f}x |")


if __name__ == "__main__":
    main()
