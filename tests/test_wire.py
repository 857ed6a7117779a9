"""The wire format: HMAC framing, bundles, and the receive paths fed garbage."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pickle
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from determined_launch.core.distributed.transport import direct, links, wire
from determined_launch.core.distributed.transport.chan import IdleTimeout
from determined_launch.core.distributed.transport.hub import Hub
from determined_launch.core.distributed.transport.member import Member

KEY = wire.job_key("k" * 32)
SKEY = wire.session_key(KEY, b"n" * 16)


@given(st.binary(max_size=200), st.binary(max_size=3000))
def test_mac_key_is_hmac_sha256(key: bytes, data: bytes) -> None:
    assert wire.MacKey(key).mac(data) == hmac.digest(key, data, "sha256")


def test_mac_key_without_the_builtin_sha256_uses_openssls(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise ImportError(name)

    monkeypatch.setattr(wire.importlib, "import_module", missing)
    fallback = wire._builtin_sha256()
    assert fallback is hashlib.sha256
    monkeypatch.setattr(wire, "_sha256", fallback)
    assert wire.MacKey(b"k" * 32).mac(b"data") == hmac.digest(b"k" * 32, b"data", "sha256")


@given(
    st.sampled_from(sorted(wire.TYPE_NAMES)),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.binary(max_size=500),
)
def test_encode_decode_round_trip(
    mtype: int, sender: int, seq: int, op: int, payload: bytes
) -> None:
    frame = wire.encode(
        KEY if mtype in (wire.HELLO, wire.WELCOME) else SKEY, mtype, sender, seq, op, payload
    )
    msg = wire.decode(frame, KEY, SKEY)
    assert (msg.mtype, msg.sender, msg.seq, msg.op, bytes(msg.payload)) == (
        mtype,
        sender,
        seq,
        op,
        payload,
    )


@given(st.binary(min_size=1, max_size=100), st.data())
def test_any_flipped_bit_is_rejected(payload: bytes, data: st.DataObject) -> None:
    frame = bytearray(wire.encode(SKEY, wire.AG, 1, 2, 3, payload))
    pos = data.draw(st.integers(0, len(frame) - 1))
    frame[pos] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(wire.BadFrame):
        wire.decode(bytes(frame), KEY, SKEY)


def test_wrong_key_and_missing_session_are_rejected() -> None:
    frame = wire.encode(wire.job_key("other" * 4), wire.AG, 1, 1, 1, b"x")
    with pytest.raises(wire.BadFrame, match="bad MAC"):
        wire.decode(frame, KEY, SKEY)
    with pytest.raises(wire.BadFrame, match="before handshake"):
        wire.decode(wire.encode(SKEY, wire.AG, 1, 1, 1), KEY, None)
    # A session frame is not a handshake frame under the job key, and back.
    with pytest.raises(wire.BadFrame):
        wire.decode(wire.encode(KEY, wire.AG, 1, 1, 1), KEY, SKEY)


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=50)), max_size=20))
def test_bundle_round_trip(parts: list[tuple[int, bytes]]) -> None:
    assert [(r, bytes(p)) for r, p in wire.decode_bundle(wire.encode_bundle(parts))] == parts


@given(st.binary(max_size=300))
def test_decode_and_bundle_raise_only_badframe(data: bytes) -> None:
    for fn in (lambda: wire.decode(data, KEY, SKEY), lambda: wire.decode_bundle(data)):
        try:
            fn()
        except wire.BadFrame:
            pass


def test_drop_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    log = wire.DropLog(logging.getLogger("test.drops"), interval=60)
    with caplog.at_level(logging.WARNING, logger="test.drops"):
        for _ in range(500):
            log.drop("bad MAC", "the global link")
    assert log.count == 500
    assert len(caplog.records) == 1
    assert "not deserialized" in caplog.records[0].getMessage()


# ------------------------------------------------- receive paths, fuzzed
@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tripwire: nothing on a receive path may deserialize."""

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a receive path unpickled bytes")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


class _Feed:
    """A channel that hands the hub prepared frames (for the pure fuzz)."""

    grace = 0.0

    def __init__(self, frames: list[tuple[bytes, bytes]]) -> None:
        self.frames = list(frames)
        self.sent: list[tuple[bytes, bytes]] = []

    def recv(self, block: bool) -> Any:
        if not self.frames:
            raise IdleTimeout
        return self.frames.pop(0)

    def send(self, peer: bytes, frame: bytes) -> bool:
        self.sent.append((peer, frame))
        return True

    def trust(self, peer: bytes) -> None:
        pass


def _hub(feed: _Feed) -> Hub:
    return Hub(
        feed,  # type: ignore[arg-type]
        rank=0,
        key=KEY,
        drops=wire.DropLog(logging.getLogger("test.fuzz")),
        where="fuzz",
        expected=1,
        check_hello=lambda peer: None,
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.binary(max_size=17), st.binary(max_size=400)), max_size=8))
def test_hub_receive_loop_survives_garbage(
    no_unpickling: None, frames: list[tuple[bytes, bytes]]
) -> None:
    hub = _hub(_Feed(frames))
    for _ in frames:
        assert hub._recv(False) is None  # dropped or handshake, never data
    with pytest.raises(IdleTimeout):
        hub._recv(False)
    assert hub.drops.count + len(hub._pending) >= 0


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_member_receive_path_survives_garbage(no_unpickling: None, data: bytes) -> None:
    member = Member(
        _Feed([]),  # type: ignore[arg-type]
        b"\x01" * 16,
        rank=1,
        hub_rank=0,
        key=KEY,
        drops=wire.DropLog(logging.getLogger("test.fuzz")),
        where="fuzz",
        role="the chief",
    )
    member.skey = SKEY
    assert member._accept(data) is None
    assert member.drops.count == 1


def test_replayed_frames_are_dropped() -> None:
    member = Member(
        _Feed([]),  # type: ignore[arg-type]
        b"\x01" * 16,
        rank=1,
        hub_rank=0,
        key=KEY,
        drops=wire.DropLog(logging.getLogger("test.replay")),
        where="replay",
        role="the chief",
    )
    member.skey = SKEY
    frame = wire.encode(SKEY, wire.BCAST, 0, 5, 1, b"payload")
    assert member._accept(frame) is not None
    assert member._accept(frame) is None  # same seq again
    assert member._accept(wire.encode(SKEY, wire.BCAST, 0, 4, 2, b"older")) is None
    assert member._accept(wire.encode(SKEY, wire.BCAST, 3, 9, 2, b"not the hub")) is None
    assert member.drops.count == 3


def test_hello_replayed_on_another_connection_is_dropped() -> None:
    peer = links.Peer(1, 2, 1, 2, 0, 1)
    rid = b"\x01" + os.urandom(15)
    hello = wire.encode(KEY, wire.HELLO, 1, 1, 0, links.pack_hello(peer, b"m" * 16, rid))
    feed = _Feed([(rid, hello), (b"\x01" + os.urandom(15), hello)])
    hub = _hub(feed)
    assert hub._recv(False) is None and hub._recv(False) is None
    assert len(feed.sent) == 1  # one WELCOME, to the connection the hello names
    assert hub.drops.count == 1
    # READY from the real member registers it; its seq must be newer.
    ready = wire.encode(hub.skey, wire.READY, 1, 2, 0)  # type: ignore[arg-type]
    feed.frames.append((rid, ready))
    hub._recv(False)
    assert hub.peers == {1: peer}


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=600))
def test_direct_hub_channel_survives_garbage_over_a_socket(
    no_unpickling: None, tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    """Arbitrary bytes, with and without a valid preamble, through a real
    Unix socket into the direct transport's parser and the hub."""
    path = tmp_path_factory.mktemp("fz") / "h.sock"
    drops = wire.DropLog(logging.getLogger("test.fuzz"))
    chan = direct.DirectHubChannel(drops, "fuzz")
    chan.bind(f"ipc://{path}")
    hub = Hub(
        chan, rank=0, key=KEY, drops=drops, where="fuzz", expected=1, check_hello=lambda p: None
    )
    try:
        for prefix in (b"", direct.PREAMBLE + os.urandom(16)):
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(path))
                client.sendall(prefix + data)
                client.shutdown(socket.SHUT_WR)
                for _ in range(50):
                    try:
                        assert hub._recv(False) is None
                    except IdleTimeout:
                        pass
                    if not chan._by_fd:
                        break
        assert hub.peers == {}
    finally:
        chan.close(0)


def test_oversized_frame_before_authentication_closes_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "h.sock"
    drops = wire.DropLog(logging.getLogger("test.big"))
    chan = direct.DirectHubChannel(drops, "big")
    chan.bind(f"ipc://{path}")
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
            client.sendall(direct.PREAMBLE + b"r" * 16 + (10**9).to_bytes(8, "big"))
            for _ in range(50):
                try:
                    chan.recv(True)
                except IdleTimeout:
                    pass
                if drops.count:
                    break
            assert drops.count == 1
            assert client.recv(10) == b""  # closed by the hub
    finally:
        chan.close(0)
