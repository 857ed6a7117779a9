"""The DistributedContext hub's accept path under idle clients and EMFILE."""

from __future__ import annotations

import logging
import os
import resource
import socket
import time

import pytest

from determined_launch.core.distributed.transport import direct, wire
from determined_launch.core.distributed.transport.chan import IdleTimeout


def hub(monkeypatch: pytest.MonkeyPatch) -> tuple[direct.DirectHubChannel, int]:
    monkeypatch.setattr(direct, "HANDSHAKE_S", 0.5, raising=False)
    chan = direct.DirectHubChannel(wire.DropLog(logging.getLogger("test.accept")), "test hub")
    port = int(chan.bind("tcp://127.0.0.1:*").rsplit(":", 1)[1])
    return chan, port


def pump(chan: direct.DirectHubChannel, seconds: float) -> list[tuple[bytes, bytes]]:
    got = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            item = chan.recv(True)
        except IdleTimeout:
            continue
        if item is not None:
            got.append(item)
    return got


def closed(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def member(port: int, chan: direct.DirectHubChannel) -> tuple[socket.socket, bytes]:
    """A connection that authenticated (the hub calls ``trust`` after READY)."""
    rid = os.urandom(16)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(direct.PREAMBLE + rid)
    end = time.monotonic() + 5
    while rid not in chan._by_rid and time.monotonic() < end:
        pump(chan, 0.05)
    chan.trust(rid)
    return sock, rid


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def test_idle_unauthenticated_connections_are_closed_after_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    chan, port = hub(monkeypatch)
    try:
        trusted, rid = member(port, chan)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        for i, sock in enumerate(idle[:20]):  # a preamble, half a frame, or nothing at all
            sock.sendall(direct.PREAMBLE + os.urandom(16) + (b"\0\0\0" if i % 2 else b""))
        pump(chan, 2.5)
        assert sum(closed(s) for s in idle) == 30
        trusted.sendall(frame(b"still here"))
        assert (rid, b"still here") in pump(chan, 0.5)
        assert not closed(trusted)
        for s in [trusted, *idle]:
            s.close()
    finally:
        chan.close(0)


def test_out_of_descriptors_in_accept_is_logged_once_and_the_hub_keeps_serving(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    chan, port = hub(monkeypatch)
    trusted, rid = member(port, chan)
    waiting = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]  # in the backlog
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 5, hard))
        cpu = time.process_time()
        with caplog.at_level(logging.WARNING, logger="determined_launch.core.distributed"):
            trusted.sendall(frame(b"first"))
            got = pump(chan, 2.0)
            trusted.sendall(frame(b"second"))
            got += pump(chan, 4.0)
        busy = time.process_time() - cpu
        # Still short of descriptors: the idle connections are closed as their handshake
        # deadlines pass, a few slots at a time; wait for all of them (on a loaded machine
        # the 6 s above were not always enough), pumping as a hub's owner does.
        served: set[int] = set()
        deadline = time.monotonic() + 30
        while True:
            served |= {i for i, s in enumerate(waiting) if i not in served and closed(s)}
            if len(served) == len(waiting) or time.monotonic() > deadline:
                break
            got += pump(chan, 0.25)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert [f for r, f in got if r == rid] == [b"first", b"second"]
        warned = [r.getMessage() for r in caplog.records if "cannot accept" in r.getMessage()]
        assert len(warned) == 1 and "Too many open files" in warned[0]
        assert busy < 3.0, f"{busy:.1f}s of CPU in 6s: spinning on a readable listener"
        # descriptors came back as idle connections were closed: every client was served
        assert len(served) == 40
    finally:
        for s in [trusted, *waiting]:
            s.close()
        chan.close(0)
