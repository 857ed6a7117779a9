"""The launchers' control channel: authenticated, replay-proof, loss-aware."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from determined_launch.supervisor.channel import (
    AuthenticatedStream,
    derive_key,
    read_nonce,
    session_key,
)
from determined_launch.supervisor.control import ChiefLink, ControlError, NodeLink, job_identity
from tests.conftest import free_port_block

SECRET = "x" * 32


def wait_for(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def closed_by_peer(sock: socket.socket) -> bool:
    """The peer hangs up (after what it sent first, e.g. the chief's heartbeat)."""
    sock.settimeout(5)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        return False
    return True


@pytest.fixture
def chief() -> Iterator[ChiefLink]:
    link = ChiefLink("127.0.0.1", free_port_block(1), num_nodes=3, secret=SECRET)
    yield link
    link.close()


def port_of(link: ChiefLink) -> int:
    return int(link.listener.getsockname()[1])


def test_messages_flow_both_ways(chief: ChiefLink) -> None:
    node = NodeLink("127.0.0.1", port_of(chief), 1, SECRET, connect_timeout=5, num_nodes=3)
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
    with pytest.raises(ControlError, match="never proved the job secret: is DET_DIST_SECRET"):
        NodeLink("127.0.0.1", port_of(chief), 1, "y" * 32, connect_timeout=1, num_nodes=3)
    assert chief.connected_nodes == set()
    assert not any(m.get("type") == "hello" for m in chief.inbox)


def handshake(port: int, num_nodes: int = 3) -> tuple[socket.socket, AuthenticatedStream]:
    """A node's side of the handshake, by hand."""
    raw = socket.create_connection(("127.0.0.1", port))
    theirs = read_nonce(raw)
    assert theirs is not None
    mine = "ab" * 16
    raw.sendall(f"{mine}\n".encode())
    key = session_key(derive_key(SECRET), job_identity(port, num_nodes), theirs, mine)
    return raw, AuthenticatedStream(raw, key, f"{theirs}.{mine}", False)


def test_replayed_line_is_rejected(chief: ChiefLink) -> None:
    # Record a valid hello made for one connection's nonces...
    raw, recorder = handshake(port_of(chief))
    recorder.send({"type": "hello", "node": 1})
    wait_for(lambda: chief.connected_nodes == {1})
    raw.close()
    wait_for(lambda: chief.connected_nodes == set())
    payload = json.dumps({"type": "hello", "node": 2}, separators=(",", ":"))
    mac = hmac.new(recorder.key, f"{recorder.nonce}|n2c|0|{payload}".encode(),
                   hashlib.sha256).hexdigest()
    # ...and replay its bytes, node nonce included, on a new connection: the chief's nonce is new.
    replay = socket.create_connection(("127.0.0.1", port_of(chief)))
    read_nonce(replay)
    replay.sendall(f"{recorder.nonce.split('.')[1]}\n{mac} {payload}\n".encode())
    assert closed_by_peer(replay)
    assert 2 not in chief.connected_nodes
    replay.close()


class Proxy:
    """A TCP proxy on loopback: the first connection either forwards to
    ``target`` recording what comes back, or (``replay``) gets those bytes
    played back whatever it sends; later connections are forwarded."""

    def __init__(self, host: str, port: int, target: int, replay: bytes = b"") -> None:
        self.target, self.replay, self.recorded = target, replay, b""
        self.listener = socket.create_server((host, port))
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.replay and self.connections == 1:
                client.sendall(self.replay)
                threading.Thread(target=self._drain, args=(client,), daemon=True).start()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True),
                             daemon=True).start()

    def _drain(self, sock: socket.socket) -> None:
        while sock.recv(65536):
            pass

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    self.recorded += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            s.close()

    def close(self) -> None:
        self.listener.close()


def test_a_recording_of_another_job_replayed_before_the_chief_answers_is_refused() -> None:
    """Job A's chief->node traffic, recorded by a proxy, then played to job B's
    node (same secret, same ports, same node count) before job B's chief answers."""
    port = free_port_block(1)
    chief_a = ChiefLink("127.0.0.1", port, num_nodes=2, secret=SECRET)
    proxy_a = Proxy("127.0.0.2", port, port)
    node_a = NodeLink("127.0.0.2", port, 1, SECRET, connect_timeout=5, num_nodes=2)
    wait_for(lambda: chief_a.connected_nodes == {1})
    chief_a.deliver({"type": "abort", "verdict": "job A failed", "status": 7})
    wait_for(lambda: any(m.get("type") == "abort" for m in node_a.inbox))
    node_a.close()
    chief_a.close()
    proxy_a.close()
    assert b"job A failed" in proxy_a.recorded

    chief_b = None
    for _ in range(50):  # job A's listener goes when its accept() returns (0.2 s)
        try:
            chief_b = ChiefLink("127.0.0.1", port, num_nodes=2, secret=SECRET)
            break
        except ControlError:
            time.sleep(0.1)
    assert chief_b is not None
    fake = Proxy("127.0.0.3", port, port, replay=proxy_a.recorded)
    try:
        node_b = NodeLink("127.0.0.3", port, 1, SECRET, connect_timeout=5, num_nodes=2)
        replayed = lambda: [m for m in node_b.inbox if m.get("type") == "abort"]  # noqa: E731
        wait_for(lambda: chief_b.connected_nodes == {1} or replayed())
        assert not replayed(), "job B's node took job A's verdict"
        wait_for(lambda: chief_b.connected_nodes == {1})  # the real chief, on a new connection
        chief_b.deliver({"type": "finish", "status": 0})
        wait_for(lambda: any(m.get("type") == "finish" for m in node_b.inbox))
        assert fake.connections == 2
        assert not any(m.get("type") in ("abort", "lost") for m in node_b.inbox), node_b.inbox
        node_b.close()
    finally:
        chief_b.close()
        fake.close()


def test_garbage_and_bad_node_numbers_are_dropped(chief: ChiefLink) -> None:
    s = socket.create_connection(("127.0.0.1", port_of(chief)))
    s.recv(64)
    s.sendall(b"\x80\x81 not a nonce\n" + b"A" * 70000)
    assert closed_by_peer(s)
    s.close()
    bad = NodeLink("127.0.0.1", port_of(chief), 7, SECRET, connect_timeout=5, num_nodes=3)
    wait_for(lambda: any(m.get("type") == "lost" for m in bad.inbox))
    bad.close()
    assert chief.connected_nodes == set()


def test_losing_a_node_is_reported(chief: ChiefLink) -> None:
    node = NodeLink("127.0.0.1", port_of(chief), 2, SECRET, connect_timeout=5, num_nodes=3)
    wait_for(lambda: chief.connected_nodes == {2})
    node.stream.sock.close()  # as if the launcher died
    wait_for(lambda: any(m.get("type") == "lost" and m.get("node") == 2 for m in chief.inbox))
    lost = [m for m in chief.inbox if m.get("type") == "lost"]
    assert "was lost" in lost[0]["why"]


def test_unreachable_chief_is_a_clear_error() -> None:
    with pytest.raises(ControlError, match=r"could not reach the chief's launcher at 127\.0\.0\.1"):
        NodeLink("127.0.0.1", free_port_block(1), 1, SECRET, connect_timeout=0.5, num_nodes=3)


def test_a_node_waiting_for_its_chief_says_so_while_it_waits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from determined_launch.supervisor import dial

    # The real schedule (10 s, 30 s, then each minute) shortened to the test's timeout.
    monkeypatch.setattr(dial, "notice_times", lambda timeout: [0.3])
    port = free_port_block(1)
    with pytest.raises(ControlError):
        NodeLink("127.0.0.1", port, 1, SECRET, connect_timeout=0.8, num_nodes=3)
    err = capsys.readouterr().err
    assert err.count("still waiting") == 1, err
    assert f"node 1 is still waiting for the chief's launcher at 127.0.0.1:{port}" in err
    assert "Connection refused" in err


def test_the_waiting_notices_come_at_10_and_30_s_then_each_minute() -> None:
    from determined_launch.supervisor.dial import notice_times

    assert notice_times(300) == [10, 30, 90, 150, 210, 270]
    assert notice_times(10) == [] and notice_times(25) == [10]


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


def test_over_long_lines_are_rate_limited_like_other_rejects(
    chief: ChiefLink, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="determined_launch.control"):
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", port_of(chief)))
            s.recv(64)
            s.sendall((f"{i:032x}\n" if i % 2 else "").encode() + b"A" * 70000)
            assert closed_by_peer(s)
            s.close()
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) <= 1, logged


def test_a_slow_drip_handshake_is_dropped_within_one_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34 §12: a peer sending its nonce one byte at a time, each byte
    within the per-recv timeout, held a connection (and a thread) for up to
    33 timeouts (~330 s); the whole handshake now has one deadline."""
    from determined_launch.supervisor import control

    monkeypatch.setattr(control, "HEARTBEAT_TIMEOUT", 1.0)
    link = ChiefLink("127.0.0.1", free_port_block(1), num_nodes=2, secret=SECRET)
    try:
        s = socket.create_connection(("127.0.0.1", port_of(link)))
        s.recv(64)  # the chief's nonce
        start, dropped = time.monotonic(), None
        for _ in range(20):  # 6 s of drip (the old code: each byte reset a 1 s timeout)
            try:
                s.sendall(b"a")
            except OSError:
                dropped = time.monotonic() - start
                break
            s.settimeout(0.3)
            try:
                if s.recv(64) == b"":
                    dropped = time.monotonic() - start
                    break
            except socket.timeout:
                pass
            except OSError:
                dropped = time.monotonic() - start
                break
        s.close()
        assert dropped is not None and dropped < 2.5, f"still connected after {dropped}"
    finally:
        link.close()
