"""The launchers' control channel: authenticated, replay-proof, loss-aware."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from determined_launch.supervisor.channel import AuthenticatedStream, derive_key
from determined_launch.supervisor.control import ChiefLink, ControlError, NodeLink
from tests.conftest import free_port_block

SECRET = "x" * 32


def wait_for(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def chief() -> Iterator[ChiefLink]:
    link = ChiefLink("127.0.0.1", free_port_block(1), num_nodes=3, secret=SECRET)
    yield link
    link.close()


def port_of(link: ChiefLink) -> int:
    return int(link.listener.getsockname()[1])


def test_messages_flow_both_ways(chief: ChiefLink) -> None:
    node = NodeLink("127.0.0.1", port_of(chief), 1, SECRET, connect_timeout=5)
    try:
        wait_for(lambda: chief.connected_nodes == {1})
        node.deliver({"type": "failed", "node": 2, "status": 3})  # a node sends to the chief
        wait_for(lambda: any(m.get("type") == "failed" for m in chief.inbox))
        failed = [m for m in chief.inbox if m["type"] == "failed"][0]
        assert failed["node"] == 1  # the connection's node, not the claimed one
        chief.deliver({"type": "abort"})  # the chief broadcasts
        wait_for(lambda: any(m.get("type") == "abort" for m in node.inbox))
    finally:
        node.close()


def test_wrong_secret_is_rejected(chief: ChiefLink) -> None:
    node = NodeLink("127.0.0.1", port_of(chief), 1, "y" * 32, connect_timeout=5)
    try:
        wait_for(lambda: any(m.get("type") == "lost" for m in node.inbox))
        assert chief.connected_nodes == set()
        assert not any(m.get("type") == "hello" for m in chief.inbox)
    finally:
        node.close()


def test_replayed_line_is_rejected(chief: ChiefLink) -> None:
    # Record a valid hello made for one connection's nonce...
    raw = socket.create_connection(("127.0.0.1", port_of(chief)))
    nonce = raw.recv(64).decode().strip()
    recorder = AuthenticatedStream(raw, derive_key(SECRET), nonce, False)
    recorder.send({"type": "hello", "node": 1})
    wait_for(lambda: chief.connected_nodes == {1})
    raw.close()
    wait_for(lambda: chief.connected_nodes == set())
    # ...and replay its bytes on a new connection, which has another nonce.
    payload = json.dumps({"type": "hello", "node": 2}, separators=(",", ":"))
    mac = hmac.new(recorder.key, f"{nonce}|n2c|0|{payload}".encode(), hashlib.sha256).hexdigest()
    replay = socket.create_connection(("127.0.0.1", port_of(chief)))
    replay.recv(64)
    replay.sendall(f"{mac} {payload}\n".encode())
    assert closed_by_peer(replay)
    assert 2 not in chief.connected_nodes
    replay.close()


def test_garbage_and_bad_node_numbers_are_dropped(chief: ChiefLink) -> None:
    s = socket.create_connection(("127.0.0.1", port_of(chief)))
    s.recv(64)
    s.sendall(b"\x80\x81 not a mac\n" + b"A" * 70000)
    assert closed_by_peer(s)
    s.close()
    bad = NodeLink("127.0.0.1", port_of(chief), 7, SECRET, connect_timeout=5)
    wait_for(lambda: any(m.get("type") == "lost" for m in bad.inbox))
    bad.close()
    assert chief.connected_nodes == set()


def test_losing_a_node_is_reported(chief: ChiefLink) -> None:
    node = NodeLink("127.0.0.1", port_of(chief), 2, SECRET, connect_timeout=5)
    wait_for(lambda: chief.connected_nodes == {2})
    node.stream.sock.close()  # as if the launcher died
    wait_for(lambda: any(m.get("type") == "lost" and m.get("node") == 2 for m in chief.inbox))
    lost = [m for m in chief.inbox if m.get("type") == "lost"]
    assert "was lost" in lost[0]["why"]


def test_unreachable_chief_is_a_clear_error() -> None:
    with pytest.raises(ControlError, match=r"could not reach the chief's launcher at 127\.0\.0\.1"):
        NodeLink("127.0.0.1", free_port_block(1), 1, SECRET, connect_timeout=0.5)


def test_busy_port_is_a_clear_error(chief: ChiefLink) -> None:
    with pytest.raises(ControlError, match="set C10D_PORT to move them"):
        ChiefLink("127.0.0.1", port_of(chief), 2, SECRET)


def test_dropped_lines_are_logged_at_most_once_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from determined_launch.supervisor import channel

    drops = channel._DropLog()
    with caplog.at_level(logging.WARNING, logger="determined_launch.control"):
        for _ in range(500):
            drops.note("malformed")
    lines = [r for r in caplog.records if "dropped lines" in r.getMessage()]
    assert len(lines) == 1 and "1 malformed" in lines[0].getMessage()
    assert drops.counts["malformed"] == 499  # counted for the next line
