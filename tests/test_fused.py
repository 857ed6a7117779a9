"""The fused hot path (transport/fused.py) over real Unix sockets: it takes
the usual case, and hands everything else to the general path untouched
(replays, bad MACs, frames for other collectives, failures, split or
coalesced frames). A hub and two members live in this process; frames the
tests forge are written straight onto the members' sockets."""

from __future__ import annotations

import logging
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from determined_launch.core.distributed.errors import DistributedError
from determined_launch.core.distributed.transport import fused, links, wire
from determined_launch.core.distributed.transport.direct import DirectHubChannel
from determined_launch.core.distributed.transport.direct_member import DirectMemberChannel
from determined_launch.core.distributed.transport.hub import Hub
from determined_launch.core.distributed.transport.member import Member

KEY = wire.job_key("f" * 32)
SIZE = 3


class Star:
    def __init__(self, hub: Hub, members: list[Member]) -> None:
        self.hub = hub
        self.members = members

    def raw_to_hub(self, member: Member, frame: bytes) -> None:
        """Bytes onto a member's connection, as if that member sent them."""
        conn = member.ch._conn  # type: ignore[attr-defined]
        conn.sock.sendall(len(frame).to_bytes(8, "big") + frame)

    def raw_to_member(self, member: Member, frame: bytes) -> None:
        conn = self.hub.ch._by_rid[member.rid]  # type: ignore[attr-defined]
        conn.sock.setblocking(True)
        try:
            conn.sock.sendall(len(frame).to_bytes(8, "big") + frame)
        finally:
            conn.sock.setblocking(False)

    def part(self, member: Member, op: int, obj: Any, mtype: int = wire.AG) -> bytes:
        """A frame ``member`` could send: its session key, its next seq."""
        member._seq += 1
        return wire.encode(member.skey, mtype, member.rank, member._seq, op, pickle.dumps(obj))  # type: ignore[arg-type]

    def collect(self, op: int) -> list[Any]:
        out: list[Any] = ["hub", None, None]
        fused.collect_into(
            self.hub, op, wire.AG, [1, 2], time.monotonic() + 10, lambda m: m, out, None
        )
        return out


@pytest.fixture
def star(tmp_path: Path) -> Iterator[Star]:
    drops = wire.DropLog(logging.getLogger("test.fused"))
    chan = DirectHubChannel(drops, "test hub")
    addr = chan.bind(f"ipc://{tmp_path}/hub.sock")
    hub = Hub(
        chan, rank=0, key=KEY, drops=drops, where="test", expected=2, check_hello=lambda p: None
    )
    members = []
    for rank in (1, 2):
        rid = links.new_rid()
        mdrops = wire.DropLog(logging.getLogger("test.fused"))
        member = Member(
            DirectMemberChannel(mdrops, "test member", rid),
            rid,
            rank=rank,
            hub_rank=0,
            key=KEY,
            drops=mdrops,
            where="test",
            role="the chief",
        )
        member.connect(addr)
        members.append(member)
    deadline = time.monotonic() + 10
    threads = [
        threading.Thread(
            target=m.handshake,
            args=(links.Peer(m.rank, SIZE, m.rank, SIZE, 0, 1), deadline, lambda: None),
        )
        for m in members
    ]
    for t in threads:
        t.start()
    hub.accept(deadline, lambda: None, lambda: b"{}")
    for t in threads:
        t.join(10)
    try:
        yield Star(hub, members)
    finally:
        for m in members:
            m.close(0)
        hub.close(0)


def _later(delay: float, fn: Any, *args: Any) -> threading.Thread:
    """Run ``fn(*args)`` after ``delay``: so that what the test wrote first
    arrives alone, in its own read."""

    def run() -> None:
        time.sleep(delay)
        fn(*args)

    t = threading.Thread(target=run)
    t.start()
    return t


def _member_round(star: Star, op: int) -> tuple[list[list[Any]], list[Any]]:
    """One real allgather: both members through the fused path, the hub too."""
    results: list[list[Any]] = [[], []]

    def member(i: int) -> None:
        m = star.members[i]
        payload = pickle.dumps(f"m{m.rank}")
        results[i] = fused.member_allgather(
            m, op, f"m{m.rank}", payload, m.rank, time.monotonic() + 10, lambda: None
        )

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    out = star.collect(op)
    star.hub.send_to([1, 2], wire.RESULT, op, pickle.dumps(out))
    for t in threads:
        t.join(10)
    return results, out


def test_the_usual_case_round_trips(star: Star) -> None:
    for op in (1, 2, 3):
        results, out = _member_round(star, op)
        assert out == ["hub", "m1", "m2"]
        assert results == [["hub", "m1", "m2"]] * 2
    assert star.hub.drops.count == 0


def _hub_drops_then_takes(star: Star, bad: bytes, op: int) -> None:
    """``bad`` arrives alone on rank 1's connection and rank 1's real part a
    moment later: the hub must drop the first and take the second."""
    m1, m2 = star.members
    drops = star.hub.drops.count
    star.raw_to_hub(m1, bad)
    t = _later(0.3, star.raw_to_hub, m1, star.part(m1, op, "m1"))
    star.raw_to_hub(m2, star.part(m2, op, "m2"))
    assert star.collect(op) == ["hub", "m1", "m2"]
    t.join()
    assert star.hub.drops.count == drops + 1


def test_hub_drops_a_replayed_part(star: Star) -> None:
    m1, m2 = star.members
    old = star.part(m1, 1, "old")
    star.raw_to_hub(m1, old)
    star.raw_to_hub(m2, star.part(m2, 1, "m2"))
    assert star.collect(1) == ["hub", "old", "m2"]
    _hub_drops_then_takes(star, old, 2)  # the same bytes again: authentic, but not new


def test_hub_drops_a_stale_sequence_number_for_the_current_collective(star: Star) -> None:
    m1 = star.members[0]
    _member_round(star, 1)
    stale = wire.encode(m1.skey, wire.AG, 1, m1._seq, 2, pickle.dumps("stale"))  # type: ignore[arg-type]
    _hub_drops_then_takes(star, stale, 2)


def test_hub_never_credits_a_part_to_a_rank_its_connection_is_not(star: Star) -> None:
    m1 = star.members[0]
    m1._seq += 1
    as_rank_2 = wire.encode(m1.skey, wire.AG, 2, m1._seq, 1, pickle.dumps("spoof"))  # type: ignore[arg-type]
    _hub_drops_then_takes(star, as_rank_2, 1)


def test_hub_drops_an_authentic_part_of_another_protocol_version(star: Star) -> None:
    m1 = star.members[0]
    m1._seq += 1
    body = wire.HEADER.pack(wire.MAGIC, wire.VERSION + 1, wire.AG, 1, m1._seq, 1) + pickle.dumps(
        "other version"
    )
    assert m1.skey is not None
    _hub_drops_then_takes(star, body + m1.skey.mac(body), 1)


def test_hub_never_takes_a_part_for_another_collective(star: Star) -> None:
    m1, m2 = star.members
    star.raw_to_hub(m1, star.part(m1, 2, "op 2"))
    star.raw_to_hub(m2, star.part(m2, 1, "m2"))
    out: list[Any] = [None] * 3
    with pytest.raises(DistributedError, match="timed out.*rank 1"):
        fused.collect_into(
            star.hub, 1, wire.AG, [1, 2], time.monotonic() + 0.6, lambda m: m, out, None
        )
    assert out[1] is None


def test_hub_reports_a_part_of_another_kind(star: Star) -> None:
    m1, m2 = star.members
    star.raw_to_hub(m1, star.part(m1, 1, "a gather part", mtype=wire.GA))
    star.raw_to_hub(m2, star.part(m2, 1, "m2"))
    with pytest.raises(DistributedError, match="rank 1 called gather while rank 0 called all"):
        star.collect(1)


def test_hub_never_unpickles_a_forged_part(star: Star, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []

    def loads(data: Any) -> Any:
        seen.append(bytes(data))
        return pickle.loads(data)

    monkeypatch.setattr(fused, "_loads", loads)
    forged = bytearray(star.part(star.members[0], 1, "forged"))
    forged[-1] ^= 1
    _hub_drops_then_takes(star, bytes(forged), 1)
    assert pickle.dumps("forged") not in seen


def test_hub_holds_a_part_that_arrives_for_a_later_collective(star: Star) -> None:
    m1, m2 = star.members
    star.raw_to_hub(m1, star.part(m1, 1, "m1-op1"))
    # Rank 1 is a collective ahead (a gather does not wait), rank 2 is late.
    t1 = _later(0.2, star.raw_to_hub, m1, star.part(m1, 2, "m1-op2"))
    t2 = _later(0.5, star.raw_to_hub, m2, star.part(m2, 1, "m2-op1"))
    assert star.collect(1) == ["hub", "m1-op1", "m2-op1"]
    t1.join()
    t2.join()
    star.raw_to_hub(m2, star.part(m2, 2, "m2-op2"))
    assert star.collect(2) == ["hub", "m1-op2", "m2-op2"]
    assert star.hub.drops.count == 0


def test_hub_keeps_early_parts_from_one_read_for_their_collective(star: Star) -> None:
    m1, m2 = star.members
    both = star.part(m1, 1, "m1-op1"), star.part(m1, 2, "m1-op2")
    conn = m1.ch._conn  # type: ignore[attr-defined]
    conn.sock.sendall(b"".join(len(f).to_bytes(8, "big") + f for f in both))
    star.raw_to_hub(m2, star.part(m2, 1, "m2-op1"))
    assert star.collect(1) == ["hub", "m1-op1", "m2-op1"]
    star.raw_to_hub(m2, star.part(m2, 2, "m2-op2"))
    assert star.collect(2) == ["hub", "m1-op2", "m2-op2"]
    assert star.hub.drops.count == 0


def test_hub_reassembles_a_part_split_across_reads(star: Star) -> None:
    m1, m2 = star.members
    frame = star.part(m1, 1, "x" * 5000)
    data = len(frame).to_bytes(8, "big") + frame
    conn = m1.ch._conn  # type: ignore[attr-defined]
    conn.sock.sendall(data[:100])
    t = _later(0.3, conn.sock.sendall, data[100:])
    star.raw_to_hub(m2, star.part(m2, 1, "m2"))
    assert star.collect(1) == ["hub", "x" * 5000, "m2"]
    t.join()


def test_hub_raises_when_a_member_reports_failure(star: Star) -> None:
    m1, _ = star.members
    m1._seq += 1
    body = links.error_body(DistributedError("boom on rank 1", [1]))
    star.raw_to_hub(m1, wire.encode(m1.skey, wire.FAIL, 1, m1._seq, 0, body))  # type: ignore[arg-type]
    with pytest.raises(DistributedError, match="boom on rank 1.*reported by rank 1"):
        star.collect(1)


# ------------------------------------------------------------- member side
def _hub_frame(star: Star, mtype: int, op: int, obj: Any, seq: int = 0) -> bytes:
    if not seq:
        star.hub._seq += 1
        seq = star.hub._seq
    return wire.encode(star.hub.skey, mtype, 0, seq, op, pickle.dumps(obj))  # type: ignore[arg-type]


def _member_allgather(star: Star, op: int, timeout: float = 10) -> list[Any]:
    m1 = star.members[0]
    return fused.member_allgather(
        m1, op, "m1", pickle.dumps("m1"), 1, time.monotonic() + timeout, lambda: None
    )


def _member_drops_then_takes(star: Star, bad: bytes, op: int) -> None:
    """``bad`` arrives alone at rank 1 and the real result a moment later."""
    m1 = star.members[0]
    drops = m1.drops.count
    star.raw_to_member(m1, bad)
    t = _later(0.3, star.raw_to_member, m1, _hub_frame(star, wire.RESULT, op, ["hub", None, "m2"]))
    assert _member_allgather(star, op) == ["hub", "m1", "m2"]
    t.join()
    assert m1.drops.count == drops + 1


def test_member_drops_a_replayed_result(star: Star) -> None:
    m1 = star.members[0]
    first = _hub_frame(star, wire.RESULT, 1, ["hub", None, "m2"])
    star.raw_to_member(m1, first)
    assert _member_allgather(star, 1) == ["hub", "m1", "m2"]
    _member_drops_then_takes(star, first, 2)  # the same authentic frame again


def test_member_drops_a_stale_sequence_number(star: Star) -> None:
    m1 = star.members[0]
    star.raw_to_member(m1, _hub_frame(star, wire.RESULT, 1, ["hub", None, "m2"]))
    assert _member_allgather(star, 1) == ["hub", "m1", "m2"]
    stale = _hub_frame(star, wire.RESULT, 2, ["hub", None, "stale"], seq=m1._last)
    _member_drops_then_takes(star, stale, 2)


def test_member_drops_a_result_that_claims_another_sender(star: Star) -> None:
    star.hub._seq += 1
    claims_rank_2 = wire.encode(
        star.hub.skey, wire.RESULT, 2, star.hub._seq, 1, pickle.dumps(["x", None, "y"])  # type: ignore[arg-type]
    )
    _member_drops_then_takes(star, claims_rank_2, 1)


def test_member_reports_a_reply_of_another_kind(star: Star) -> None:
    m1 = star.members[0]
    star.raw_to_member(m1, _hub_frame(star, wire.BCAST, 1, "a broadcast"))
    with pytest.raises(DistributedError, match="collective mismatch"):
        _member_allgather(star, 1)


def test_member_raises_on_abort(star: Star) -> None:
    m1 = star.members[0]
    body = links.error_body(DistributedError("rank 2 died", [2]))
    star.hub._seq += 1
    star.raw_to_member(
        m1, wire.encode(star.hub.skey, wire.ABORT, 0, star.hub._seq, 0, body)  # type: ignore[arg-type]
    )
    with pytest.raises(DistributedError, match="rank 2 died"):
        _member_allgather(star, 1)


def test_member_reports_the_hubs_timeout_verdict_not_its_own(star: Star) -> None:
    """The hub's ABORT (naming the rank that never came) arrives after the
    deadline, and after the member's first check of it (at the end of its
    second 250 ms slice): the member reports the ABORT rather than its own
    "the chief did not answer"."""
    m1 = star.members[0]
    body = links.error_body(DistributedError("no contribution from rank 2", [2]))
    star.hub._seq += 1
    abort = wire.encode(star.hub.skey, wire.ABORT, 0, star.hub._seq, 0, body)  # type: ignore[arg-type]
    t = _later(0.55, star.raw_to_member, m1, abort)
    with pytest.raises(DistributedError, match="no contribution from rank 2") as e:
        _member_allgather(star, 1, timeout=0.3)
    t.join()
    assert e.value.missing_ranks == (2,)


def test_member_reports_a_result_for_another_collective(star: Star) -> None:
    m1 = star.members[0]
    star.raw_to_member(m1, _hub_frame(star, wire.RESULT, 7, ["hub", None, "m2"]))
    with pytest.raises(DistributedError, match="collective mismatch"):
        _member_allgather(star, 1)


def test_member_rejects_an_authentic_result_that_is_not_a_list(star: Star) -> None:
    m1 = star.members[0]
    star.raw_to_member(m1, _hub_frame(star, wire.RESULT, 1, {"not": "a list"}))
    with pytest.raises(DistributedError, match="malformed result.*dict"):
        _member_allgather(star, 1)


def test_member_of_two_ranks_places_the_hubs_part(star: Star) -> None:
    """With two ranks the hub sends only its part (PART), not a list."""
    m1 = star.members[0]
    star.raw_to_member(m1, _hub_frame(star, wire.PART, 1, ["the hub's part"]))
    assert _member_allgather(star, 1) == [["the hub's part"], "m1"]


def test_member_ignores_a_forged_result(star: Star) -> None:
    forged = bytearray(_hub_frame(star, wire.RESULT, 1, ["forged", None, "x"]))
    forged[-1] ^= 1
    _member_drops_then_takes(star, bytes(forged), 1)


# --------------------------------------------------------------- hub sends
def _sent_to_both(star: Star, obj: Any, read_after: float = 0.0) -> dict[int, Any]:
    """``fused.send_to`` a result to both members, which read it on the
    general path (after ``read_after`` seconds); what each one got."""
    got: dict[int, Any] = {}

    def receive(m: Member) -> None:
        time.sleep(read_after)
        got[m.rank] = pickle.loads(m.wait(1, wire.RESULT, time.monotonic() + 10))

    threads = [threading.Thread(target=receive, args=(m,)) for m in star.members]
    for t in threads:
        t.start()
    fused.send_to(star.hub, [1, 2], wire.RESULT, 1, pickle.dumps(obj), time.monotonic() + 10)
    for t in threads:
        t.join(10)
    return got


def test_hub_send_finishes_a_frame_the_socket_took_only_part_of(star: Star) -> None:
    conn = star.hub.ch._by_rid[star.members[0].rid]  # type: ignore[attr-defined]
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = "x" * 100_000
    # The members read late, so the hub's first send fills rank 1's small buffer.
    assert _sent_to_both(star, big, read_after=0.2) == {1: big, 2: big}


def test_hub_send_names_a_member_that_is_gone(star: Star) -> None:
    _, m2 = star.members
    m2.close(0)
    time.sleep(0.1)
    with pytest.raises(DistributedError, match="rank 2 disconnected before a allgather"):
        fused.send_to(star.hub, [1, 2], wire.RESULT, 1, pickle.dumps("r"), time.monotonic() + 5)


def test_hub_send_of_a_frame_larger_than_a_chunk_goes_the_general_way(star: Star) -> None:
    big = b"y" * (300 * 1024)  # over stream.CHUNK: sent as two pieces
    assert _sent_to_both(star, big) == {1: big, 2: big}


def test_member_drops_an_authentic_frame_of_another_protocol_version(star: Star) -> None:
    """A peer with the job's key but another wire version: its MAC checks
    out, its header does not, and the fast path must not take it."""
    star.hub._seq += 1
    body = wire.HEADER.pack(
        wire.MAGIC, wire.VERSION + 1, wire.RESULT, 0, star.hub._seq, 1
    ) + pickle.dumps(["other", None, "version"])
    assert star.hub.skey is not None
    _member_drops_then_takes(star, body + star.hub.skey.mac(body), 1)
