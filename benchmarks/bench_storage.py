"""Checkpoint upload/download against S3: ours vs s3fs put/get vs boto3's
transfer manager (and obstore, when installed), on the same moto server (a
separate process on loopback).

    python benchmarks/bench_storage.py [--size-mb 1024] [--reps 3]
        [--layouts 64,1] [--one-file-upload-only]

Two layouts of the same total size: 64 files, and 1 file. "ours" is
``CheckpointContext.upload`` (parallel uploads, a sliding window of parts for
large files, size check of every file, then the commit marker) and
``download`` (requires the marker, then parallel downloads). Reps are
interleaved (the order rotates), so the tools see the same machine load.
Per tool: wall time, the client's CPU time (``time.process_time``, all its
threads) and the moto server's CPU time; the ratio is the median over reps of
each rep's paired ratio (faster peer's wall / ours), so load that shifts
between reps cancels out.

boto3's transfer manager with ``awscrt`` is not a column: boto3 builds the
CRT client's requests for AWS's own endpoint (``endpoint_url=None``), and
s3transfer's CRT client pointed at moto fails on a loopback endpoint
(``AWS_IO_DNS_INVALID_NAME``), so it cannot be measured against moto here.
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
from typing import Any, Optional

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from determined_launch.core._context import _single_process  # noqa: E402
from determined_launch.core._rundir import RunDir  # noqa: E402
from determined_launch.core.checkpoint import CheckpointContext  # noqa: E402
from determined_launch.core.storage import (  # noqa: E402
    multipart,
    objectstore,
    open_storage,
    parse_storage,
)
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


Timing = tuple[float, float, float]  # wall s, client CPU s, server CPU s
_SERVER: list[Any] = []  # psutil.Process of the moto server


def _server_cpu() -> float:
    if not _SERVER:
        return 0.0
    t = _SERVER[0].cpu_times()
    return float(t.user + t.system)


def timed(fn: Callable[[], Any]) -> Timing:
    s0, c0, w0 = _server_cpu(), time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return wall, cpu, _server_cpu() - s0


def have_obstore() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layouts", default="64,1", help="file counts, e.g. 64,1 or 1")
    ap.add_argument("--tools", default="ours,s3fs,boto3,obstore",
                    help="with obstore or not (ours, s3fs and boto3 always run)")
    ap.add_argument("--one-file-upload-only", action="store_true",
                    help="skip the 1-file download (boto3 takes ~110 s for it on moto)")
    args = ap.parse_args()

    import boto3
    import psutil

    from tests.conftest import free_port_block

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-storage-"))
    port = free_port_block(1)
    server = start_moto(port, work)
    _SERVER.append(psutil.Process(server.pid))
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **KEYS)
    client.create_bucket(Bucket="bench")
    total = args.size_mb << 20
    results: dict[tuple[str, str, str], list[Timing]] = {}
    # ours and both peers always (the ratio needs them); obstore if asked and installed
    with_obstore = "obstore" in args.tools.split(",") and have_obstore()
    tools = ("ours", "s3fs", "boto3") + (("obstore",) if with_obstore else ())
    print(f"tools: {', '.join(tools)}; load average {os.getloadavg()[0]:.1f}", flush=True)
    try:
        for count in (int(c) for c in args.layouts.split(",")):
            src = work / f"src-{count}"
            make_files(src, total, count)
            os.sync()  # no write-back of the source files during the first timed run
            layout = f"{count} file{'s' if count > 1 else ''}"
            down_too = count > 1 or not args.one_file_upload_only
            for rep in range(args.reps):
                n = rep % len(tools)
                for tool in tools[n:] + tools[:n]:  # no tool always first
                    dst = work / "dst"
                    shutil.rmtree(dst, ignore_errors=True)
                    prefix = f"{tool}-{count}-{rep}"
                    up, down = with_retry(tool, functools.partial(
                        round_trip, tool, client, endpoint, work, src, dst, prefix, down_too))
                    results.setdefault((layout, "upload", tool), []).append(up)
                    stored = sum(o["Size"] for page in client.get_paginator(
                        "list_objects_v2").paginate(Bucket="bench", Prefix=prefix + "/")
                        for o in page.get("Contents", []) if o["Key"].endswith(".bin"))
                    if stored != (total // count) * count:
                        raise RuntimeError(f"{tool}: uploaded {stored} bytes, expected {total}")
                    line = (f"{layout:8} rep {rep} {tool:7} up {up[0]:6.2f} s (cpu {up[1]:5.2f},"
                            f" server {up[2]:5.2f})")
                    if down is not None:
                        results.setdefault((layout, "download", tool), []).append(down)
                        got = sum(p.stat().st_size for p in dst.rglob("*.bin"))
                        if got != (total // count) * count:
                            raise RuntimeError(f"{tool}: downloaded {got} bytes, expected {total}")
                        line += f"  down {down[0]:6.2f} s (cpu {down[1]:5.2f})"
                    print(f"{line}  load {os.getloadavg()[0]:.1f}", flush=True)
                    empty_prefix(client, prefix)  # bound the server's memory
            shutil.rmtree(src)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    report(results, args.size_mb, tools)


def empty_prefix(client: Any, prefix: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket="bench", Delete={"Objects": keys})


RoundTrip = tuple[Timing, Optional[Timing]]


def round_trip(tool: str, client: Any, endpoint: str, work: pathlib.Path, src: pathlib.Path,
               dst: pathlib.Path, prefix: str, down_too: bool) -> RoundTrip:
    shutil.rmtree(dst, ignore_errors=True)
    empty_prefix(client, prefix)
    if tool == "ours":
        up, down = ours_round_trip(endpoint, work, src, dst, prefix)
    elif tool == "s3fs":
        up, down = s3fs_round_trip(endpoint, src, dst, prefix)
    elif tool == "boto3":
        up, down = boto3_round_trip(client, src, dst, prefix)
    else:
        up, down = obstore_round_trip(endpoint, src, dst, prefix)
    return timed(up), (timed(down) if down_too else None)


def with_retry(tool: str, fn: Callable[[], RoundTrip]) -> RoundTrip:
    """moto on a loaded 2-core machine sometimes answers 500 to a 1 GB
    CompleteMultipartUpload; such a run is repeated (and said so), for every tool."""
    for attempt in range(3):
        try:
            return fn()
        except Exception as e:
            print(f"  {tool}: attempt {attempt + 1} failed ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120]}); repeating", flush=True)
    raise RuntimeError(f"{tool}: failed 3 times")


Actions = tuple[Callable[[], Any], Callable[[], Any]]  # upload, download: set up, not run


def ours_round_trip(endpoint: str, work: pathlib.Path, src: pathlib.Path, dst: pathlib.Path,
                    prefix: str) -> Actions:
    spec = parse_storage({"type": "s3", "bucket": "bench", "prefix": prefix,
                          "endpoint_url": endpoint, "access_key": "testing",
                          "secret_key": "testing"}, where="bench")
    backend = open_storage(spec)
    backend.list_ids()  # warm: the clients are built outside the timing, as the peers'
    if isinstance(backend, objectstore.ObjectStorage):
        multipart.sync_client(backend.fs, objectstore.S3_PARTS_IN_FLIGHT)
    ctx = CheckpointContext(_single_process(), backend, RunDir(work / "run", trial_id=None))
    sid: list[str] = []
    return lambda: sid.append(ctx.upload(src, {})), lambda: ctx.download(sid[0], dst)


def s3fs_round_trip(endpoint: str, src: pathlib.Path, dst: pathlib.Path,
                    prefix: str) -> Actions:
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint,
                           skip_instance_cache=True)
    fs.ls("bench")  # warm, as for ours
    return (lambda: fs.put(str(src) + "/", f"bench/{prefix}/", recursive=True),
            lambda: fs.get(f"bench/{prefix}/", str(dst) + "/", recursive=True))


def boto3_round_trip(client: Any, src: pathlib.Path, dst: pathlib.Path,
                     prefix: str) -> Actions:
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

    return upload, download


def obstore_round_trip(endpoint: str, src: pathlib.Path, dst: pathlib.Path,
                       prefix: str) -> Actions:
    """obstore (Rust object_store) with boto3's part size and window: files
    10 at once as coroutines, each large one 10 parts at once."""
    import asyncio

    import obstore
    from obstore.store import S3Store

    store = S3Store("bench", endpoint=endpoint, access_key_id="testing",
                    secret_access_key="testing", region="us-east-1",
                    client_options={"allow_http": True})
    files = sorted(src.iterdir())

    async def put_all() -> None:
        gate = asyncio.Semaphore(10)

        async def one(p: pathlib.Path) -> None:
            async with gate:
                await obstore.put_async(store, f"{prefix}/{p.name}", p,
                                        chunk_size=8 << 20, max_concurrency=10)
        await asyncio.gather(*(one(p) for p in files))

    async def get_all() -> None:
        gate = asyncio.Semaphore(10)
        dst.mkdir(parents=True, exist_ok=True)

        async def one(p: pathlib.Path) -> None:
            async with gate:
                got = await obstore.get_async(store, f"{prefix}/{p.name}")
                with open(dst / p.name, "wb") as f:
                    async for chunk in got.stream(min_chunk_size=8 << 20):
                        f.write(chunk)
        await asyncio.gather(*(one(p) for p in files))

    return lambda: asyncio.run(put_all()), lambda: asyncio.run(get_all())


def report(results: dict[tuple[str, str, str], list[Timing]], size_mb: int,
           tools: tuple[str, ...]) -> None:
    print(f"\n{size_mb} MB; wall s (client CPU s, server CPU s), medians; ratio: median of each "
          "rep's faster s3fs/boto3 wall over ours (> 1: ours faster)")
    print("| layout | direction | " + " | ".join(tools) + " | ours MB/s | ours / faster peer |")
    print("|---|---|" + "---|" * (len(tools) + 2))
    for layout in ("64 files", "1 file"):
        for direction in ("upload", "download"):
            if (layout, direction, "ours") not in results:
                continue
            runs = {t: results[(layout, direction, t)] for t in tools}
            cells = [f"{statistics.median(r[0] for r in runs[t]):.2f} "
                     f"({statistics.median(r[1] for r in runs[t]):.2f}, "
                     f"{statistics.median(r[2] for r in runs[t]):.2f})" for t in tools]
            ratios = [min(runs["s3fs"][i][0], runs["boto3"][i][0]) / runs["ours"][i][0]
                      for i in range(len(runs["ours"]))]
            ours = statistics.median(r[0] for r in runs["ours"])
            print(f"| {layout} | {direction} | " + " | ".join(cells) +
                  f" | {size_mb / ours:.0f} | {statistics.median(ratios):.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
