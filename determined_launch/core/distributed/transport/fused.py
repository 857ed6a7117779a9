"""The usual case of a collective on the ``direct`` transport, in one
function per end.

Why this exists: with more ranks than cores, a collective is bound by the
CPU of all its processes (at 8 ranks on 2 cores the members' together
twice the chief's), and much of that was Python call overhead spread over
the layers (``ops`` -> ``hub`` -> channel -> ``Conn`` -> ``wire``): about
25 functions per collective on the chief, 10 on a member, each one's code
and data touched cold again after every context switch. Fusing the usual
case, then binding a member's socket methods once and computing the MACs
inline, brought both ends within 2-3 % of a bare hand-written loop over
the same sockets, measured paired in the same processes on this project's
2-core machine (benchmarks/RESULTS-distributed.md).

The usual case is one whole frame per read, authenticated and expected.
These functions take only what the general path would take (the MAC
before anything else in the frame is trusted, then wire version, type,
sender, sequence number and collective), and leave everything else to the general
path untouched: a partial or extra frame, a bad MAC, a FAIL or ABORT, a
frame for another collective, a slice without traffic (liveness and
deadline checks), a new or lost connection. Frames they read but do not
take go back to the channel's queue in arrival order, and the general
path (``Hub.collect``, ``Member.wait_any``) finishes the collective.

They read the link's and channel's state directly (sequence numbers,
connections, queues): they are those classes' fast path, kept in one
module so that the general path stays readable on its own.
"""

from __future__ import annotations

import hmac
import pickle
import struct
from collections.abc import Iterable
from typing import Any, Callable, Optional

from determined_launch.core.distributed.errors import DistributedError
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import SLICE_MS
from determined_launch.core.distributed.transport.direct import DirectHubChannel
from determined_launch.core.distributed.transport.direct_member import DirectMemberChannel
from determined_launch.core.distributed.transport.hub import Hub
from determined_launch.core.distributed.transport.member import Member
from determined_launch.core.distributed.transport.stream import (
    CHUNK,
    DONTWAIT,
    LEN_SIZE,
    POLL_OUT,
    Conn,
)

# The loops below use literal sizes (length prefix 8, header 24, MAC 32, so a
# whole frame is at least 64 bytes with its prefix): they run for every message.
if (LEN_SIZE, wire.HEADER_SIZE, wire.MAC_SIZE) != (8, 24, 32):  # pragma: no cover
    raise ImportError("fused.py's literal frame sizes no longer match wire.py")
_HEAD = wire.HEADER
#: The length prefix and the header, packed at once (the frame is 56 bytes + payload).
_LHEAD = struct.Struct("!Q" + wire.HEADER.format.lstrip("!"))
_MAGIC = wire.MAGIC
_VERSION = wire.VERSION
_AG = wire.AG
_RESULT = wire.RESULT
#: What a member's allgather gets back: the result, or (two ranks) the hub's part.
_REPLY = (wire.RESULT, wire.PART)
_LEN = struct.Struct("!Q")
_same = hmac.compare_digest
_loads = pickle.loads

#: A member's connection, its socket's ``send`` and ``recv_into``, its
#: channel's ``poll`` and scratch buffer, the session key's inner and outer
#: hash copiers (``MacKey.copies``), and the channel.
MemberIO = tuple[
    Conn,
    Callable[..., int],
    Callable[..., int],
    Callable[[int], list[tuple[int, int]]],
    memoryview,
    Callable[[], Any],
    Callable[[], Any],
    DirectMemberChannel,
]


def member_allgather(
    member: Member,
    op: int,
    stuff: Any,
    payload: bytes,
    own: int,
    deadline: Optional[float],
    idle: Callable[[], None],
) -> list[Any]:
    """A member's allgather: send this rank's pickled part, return every
    rank's part with ``stuff`` at index ``own``. The MACs are computed
    inline (``MacKey.copies``): two Python calls fewer per collective."""
    io = member.fast_io or _fast_io(member)
    if io is None:
        return _result(*member.exchange(_AG, op, payload, _REPLY, deadline, idle), stuff, own)
    conn, send, recv_into, poll, scratch, inner, outer, ch = io
    if conn.out or conn.buf or not conn.alive or ch._ready or member._held:
        return _result(*member.exchange(_AG, op, payload, _REPLY, deadline, idle), stuff, own)
    member._seq += 1
    data = _LHEAD.pack(56 + len(payload), _MAGIC, _VERSION, _AG, member.rank, member._seq, op)
    h = inner()
    h.update(data[8:])  # the MAC covers what follows the length prefix
    h.update(payload)
    tag = outer()
    tag.update(h.digest())
    data += payload
    data += tag.digest()
    try:
        sent = send(data, DONTWAIT)
    except BlockingIOError:
        sent = 0
    except OSError:
        ch._lost(conn)  # the general wait reports the hub's loss
        sent = -1
    if sent == len(data):
        n = -1  # nothing yet: the general wait checks liveness and the deadline
        if poll(SLICE_MS):
            try:
                n = recv_into(scratch, 0, DONTWAIT)
            except BlockingIOError:
                pass
            except OSError:
                n = 0
        if n >= 64 and _LEN.unpack_from(scratch)[0] == n - 8 <= conn.limit:
            # Exactly one whole frame, the usual case: the MAC before anything else.
            frame = bytes(scratch[8:n])
            h = inner()
            h.update(frame[:-32])
            tag = outer()
            tag.update(h.digest())
            if _same(tag.digest(), frame[-32:]):
                magic, version, rtype, sender, seq, rop = _HEAD.unpack_from(frame)
                if (
                    rtype in _REPLY
                    and sender == member.hub_rank
                    and seq > member._last
                    and rop == op
                    and magic == _MAGIC
                    and version == _VERSION
                ):
                    member._last = seq
                    got = _loads(frame[24:-32])
                    if rtype == _RESULT and type(got) is list:
                        got[own] = stuff  # _placed's usual case, inline
                        return got
                    return _placed(rtype, got, stuff, own)
            ch._queue(conn, [frame])
        elif n >= 0:
            ch._queue(conn, conn.take(scratch, n))
    elif sent >= 0:  # the socket buffer is full: finish the send as the general path does
        conn.out.append(memoryview(data)[sent:])
        if not ch._flush(conn, deadline):
            raise member._send_timeout(_AG)
    return _result(*member.wait_any(op, _REPLY, deadline, idle), stuff, own)


def _fast_io(member: Member) -> Optional[MemberIO]:
    """What ``member_allgather`` uses of a member on the direct transport,
    bound once (each attribute hop costs on every collective); None on any
    other transport, or before the session key is agreed."""
    ch = member.ch
    if not isinstance(ch, DirectMemberChannel) or ch._conn is None or member.skey is None:
        return None
    conn = ch._conn
    sock = conn.sock
    inner, outer = member.skey.copies()
    io = (conn, sock.send, sock.recv_into, ch._poll.poll, ch._scratch, inner, outer, ch)
    member.fast_io = io
    return io


def _result(rtype: int, reply: memoryview, stuff: Any, own: int) -> list[Any]:
    """The list a member's allgather returns, from the hub's authenticated reply."""
    return _placed(rtype, _loads(reply), stuff, own)


def _placed(rtype: int, got: Any, stuff: Any, own: int) -> list[Any]:
    """``_result`` once the reply is unpickled."""
    if rtype == wire.PART:  # the two-rank exchange: the hub's part only
        return [got, stuff] if own else [stuff, got]
    out = _checked(got)
    out[own] = stuff
    return out


def result_list(reply: wire.Buffer) -> list[Any]:
    """An authenticated allgather result: unpickled, and checked to be a list."""
    return _checked(_loads(reply))


def _checked(out: Any) -> list[Any]:
    if type(out) is not list:
        raise DistributedError(f"malformed result from an authenticated peer: {type(out)}")
    return out


def collect_into(
    hub: Hub,
    op: int,
    want: int,
    senders: Iterable[int],
    deadline: Optional[float],
    probe_for: Callable[[set[int]], Iterable[int]],
    out: list[Any],
    index: Optional[Callable[[int], int]],
) -> None:
    """``Hub.collect``, unpickling each sender's part of type ``want`` for
    collective ``op`` into ``out`` at ``index(rank)`` (the rank itself when
    ``index`` is None) as it arrives, so that the work overlaps the wait
    for later parts. Fast when the usual case holds, general otherwise."""
    missing = set(senders)
    ch = hub.ch
    skey = hub.skey
    if type(ch) is DirectHubChannel and skey is not None and not hub._inbox and not ch._ready:
        _collect_usual(hub, ch, skey, op, want, missing, out, index)
    if missing:

        def unpickle(rank: int, part: memoryview) -> None:
            out[rank if index is None else index(rank)] = _loads(part)

        hub.collect(op, want, missing, deadline, probe_for, each=unpickle)


def _collect_usual(
    hub: Hub,
    ch: DirectHubChannel,
    skey: wire.MacKey,
    op: int,
    want: int,
    missing: set[int],
    out: list[Any],
    index: Optional[Callable[[int], int]],
) -> None:
    """``collect_into``'s usual case: whole, authentic, expected frames,
    one per read. Returns at the first thing that is not (leaving it queued
    in the channel for the general path) or when nothing is ``missing``."""
    inner, outer = skey.copies()
    rank_of = hub._rank_of
    last = hub._last
    by_fd = ch._by_fd
    scratch = ch._scratch
    poll = ch._poll.poll
    unpack_len, unpack, same, loads = _LEN.unpack_from, _HEAD.unpack_from, _same, _loads
    while missing:
        events = poll(SLICE_MS)
        if not events:
            return  # a quiet slice: the general path checks liveness and the deadline
        for fd, flags in events:
            conn = by_fd.get(fd)
            if conn is None or flags & POLL_OUT or conn.buf or conn.rid is None:
                return  # the listener, a backlog or a half-read frame: the general path
            try:
                n = conn.sock.recv_into(scratch)
            except BlockingIOError:
                continue
            except OSError:
                n = 0
            if n >= 64 and unpack_len(scratch)[0] == n - 8 <= conn.limit:
                # Exactly one whole frame: the MAC before anything else in it.
                frame = bytes(scratch[8:n])
                h = inner()
                h.update(frame[:-32])
                tag = outer()
                tag.update(h.digest())
                if same(tag.digest(), frame[-32:]):
                    magic, version, ftype, sender, seq, fop = unpack(frame)
                    rank = rank_of.get(conn.rid, -1)
                    if (
                        sender == rank
                        and rank in missing
                        and ftype == want
                        and seq > last[rank]
                        and fop == op
                        and magic == _MAGIC
                        and version == _VERSION
                    ):
                        last[rank] = seq
                        missing.discard(rank)
                        # Authenticated, and from the rank it names: only now unpickled.
                        out[rank if index is None else index(rank)] = loads(frame[24:-32])
                        continue
                ch._ready.append((conn.rid, frame))
                return
            taken = conn.take(scratch, n)
            if taken is None:
                ch._lost_or_bad(conn)
                return
            if taken:
                ch._ready.extend((conn.rid, f) for f in taken)
                return
            # else part of a frame, now buffered: the next poll goes on


def send_to(
    hub: Hub,
    ranks: list[int],
    mtype: int,
    op: int,
    payload: bytes,
    deadline: Optional[float],
) -> None:
    """``Hub.send_to``, with the usual case (the frame fits each socket's
    buffer) in one loop. From the first connection that is not the usual
    case on, ``send_many`` takes over, finishing a frame begun here."""
    ch = hub.ch
    if type(ch) is not DirectHubChannel:
        hub.send_to(ranks, mtype, op, payload, deadline)
        return
    frame = hub.frame(mtype, op, payload)
    data = len(frame).to_bytes(8, "big") + frame
    size = len(data)
    rid_of = hub._rid
    conns = list(map(ch._by_rid.get, map(rid_of.__getitem__, ranks)))
    begun: tuple[Conn, ...] = ()
    stop = 0
    if size <= CHUNK:
        dontwait = DONTWAIT
        for conn in conns:
            if conn is None or conn.out:
                break
            try:
                sent = conn.sock.send(data, dontwait)
            except OSError:  # a full buffer or a broken connection: the general path
                break
            if sent != size:
                conn.out.append(memoryview(data)[sent:])
                begun = (conn,)
                break
        else:
            return
        # From the connection the loop stopped at (after it, if it holds part of the frame).
        stop = conns.index(conn) + len(begun)
    rest_rids = list(map(rid_of.__getitem__, ranks[stop:]))
    hub.check_sent(ch.send_many(rest_rids, frame, deadline, begun), mtype, deadline)
