"""ZeroMQ links of a ``DistributedContext``: one hub, many members.

A *hub* (the chief, or a node's local chief) binds one ROUTER socket; each
*member* connects one DEALER socket to it. ROUTER/DEALER is bidirectional,
so one port carries contributions up and results down, and the hub only
ever sends to members it has heard from, which removes the PUB/SUB "slow
joiner" problem that Determined's hello loop works around: a message is
never sent before its receiver is known to be connected.

Handshake (per link, at start-up)::

    member -> hub   HELLO  (job key)     rank layout, member nonce, routing id
    hub -> member   WELCOME (job key)    hub nonce + the member's nonce echoed
    member -> hub   READY  (session key) proves the member is live now
    hub -> members  START  (session key) once every expected member is READY

The session key is derived from the hub's fresh nonce, so a HELLO replayed
from an earlier job (same secret) never gets past READY. The routing id is
random per connection and bound into HELLO, so frames replayed from another
connection are not attributed to the rank they name.

Failure detection needs no Python thread. libzmq's own I/O thread sends
ZMTP heartbeats on every connection (a silent peer is disconnected after
``HEARTBEAT_TIMEOUT``), and process death closes the socket at once:

- a member watches its socket monitor; its hub gone for ``GRACE`` seconds
  means the hub (the chief or the local chief) is dead;
- a hub waiting for contributions probes the missing ranks every
  ``PROBE_INTERVAL`` with a PING sent under ``ROUTER_MANDATORY``: a peer whose
  connection is gone makes the send fail with ``EHOSTUNREACH``. Unreachable
  for ``GRACE`` seconds means dead; the hub then sends ABORT, naming the
  missing ranks, to every member and raises.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import json
import logging
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Callable, Optional, Union

import zmq
from zmq.utils.monitor import recv_monitor_message

from determined_launch.core import wire
from determined_launch.core._dist_errors import (
    DistributedConfigError,
    DistributedError,
    format_ranks,
)

logger = logging.getLogger("determined_launch.core.distributed")

#: How often a blocked wait wakes up to check liveness and deadlines.
SLICE_MS = 250
#: How often a waiting hub probes the ranks it is missing.
PROBE_INTERVAL = 0.5
#: How long a peer may stay unreachable before it counts as dead. Covers a
#: reconnect after a transient network error, and keeps detection well
#: inside the 10 s the docs promise.
GRACE = 2.0
#: Normal close: how long undelivered frames may hold up interpreter exit.
#: Bounded, so exit never hangs, but long enough that a result sent just
#: before ``close()`` still reaches live peers.
LINGER_MS = 1000
_SOCKOPTS = {
    zmq.SNDHWM: 0,  # never drop or block a result because a peer is busy computing
    zmq.RCVHWM: 0,
    zmq.RCVTIMEO: SLICE_MS,
    zmq.LINGER: LINGER_MS,
    zmq.HEARTBEAT_IVL: 1000,
    zmq.HEARTBEAT_TIMEOUT: 4000,
    zmq.HEARTBEAT_TTL: 6000,
}
_LARGE = 64 * 1024  # frames at least this big are sent zero-copy to each member

# ---------------------------------------------------------------- zmq context
_zctx: Optional[zmq.Context[Any]] = None
_zctx_pid = 0
_zctx_lock = threading.Lock()


def zmq_context() -> zmq.Context[Any]:
    """One zmq context per process (re-created after fork), destroyed at exit.

    ``destroy`` rather than ``term``: it closes any socket still open (with
    the bounded linger above) instead of waiting for it forever.
    """
    global _zctx, _zctx_pid
    with _zctx_lock:
        if _zctx is None or _zctx.closed or _zctx_pid != os.getpid():
            _zctx = zmq.Context()
            _zctx_pid = os.getpid()
            atexit.register(_destroy_at_exit, _zctx, _zctx_pid)
        return _zctx


def _destroy_at_exit(ctx: zmq.Context[Any], pid: int) -> None:
    if pid == os.getpid() and not ctx.closed:
        ctx.destroy(linger=LINGER_MS)


def new_socket(kind: int) -> zmq.Socket[Any]:
    sock = zmq_context().socket(kind)
    for opt, value in _SOCKOPTS.items():
        sock.setsockopt(opt, value)
    return sock


# ------------------------------------------------------------------ handshake
@dataclasses.dataclass(frozen=True)
class Peer:
    """What a member says about itself in HELLO."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    #: Mode bits every rank must agree on (hierarchical).
    flags: int = 0
    #: The node-local hub's address when this member is a local chief.
    local_addr: str = ""


_HELLO = struct.Struct("!7I16sH")


def pack_hello(peer: Peer, nonce: bytes, rid: bytes) -> bytes:
    fields = dataclasses.astuple(peer)[:-1]
    return _HELLO.pack(*fields, nonce, len(rid)) + rid + peer.local_addr.encode()


def unpack_hello(payload: Union[bytes, memoryview]) -> tuple[Peer, bytes, bytes]:
    if len(payload) < _HELLO.size:
        raise wire.BadFrame("short hello")
    rank, size, local_rank, local_size, cross_rank, cross_size, flags, nonce, rid_len = (
        _HELLO.unpack_from(payload)
    )
    rest = bytes(payload[_HELLO.size :])
    if rid_len > len(rest):
        raise wire.BadFrame("hello routing id exceeds payload")
    try:
        addr = rest[rid_len:].decode()
    except UnicodeDecodeError:
        raise wire.BadFrame("hello address is not UTF-8") from None
    peer = Peer(rank, size, local_rank, local_size, cross_rank, cross_size, flags, addr)
    return peer, nonce, rest[:rid_len]


def _is_unreachable(e: zmq.ZMQError) -> bool:
    return e.errno == errno.EHOSTUNREACH


class _Link:
    """What hubs and members share: a socket, keys, a send sequence."""

    def __init__(
        self, sock: zmq.Socket[Any], rank: int, key: bytes, drops: wire.DropLog, where: str
    ) -> None:
        self.sock = sock
        self.rank = rank
        self.key = key
        self.skey: Optional[bytes] = None
        self.drops = drops
        self.where = where
        self._seq = 0

    def frame(self, mtype: int, op: int, payload: bytes = b"") -> bytes:
        self._seq += 1
        key = self.key if mtype in (wire.HELLO, wire.WELCOME) else self.skey
        if key is None:  # pragma: no cover - internal ordering error
            raise RuntimeError("session frame before handshake")
        return wire.encode(key, mtype, self.rank, self._seq, op, payload)

    def close(self, linger_ms: int) -> None:
        if not self.sock.closed:
            self.sock.close(linger=linger_ms)


def _deadline_passed(deadline: Optional[float], now: float) -> bool:
    return deadline is not None and now >= deadline


# ------------------------------------------------------------------------ hub
class Hub(_Link):
    """The ROUTER side: registers members, collects, fans out, probes."""

    def __init__(
        self,
        *,
        rank: int,
        key: bytes,
        drops: wire.DropLog,
        where: str,
        expected: int,
        check_hello: Callable[[Peer], Optional[str]],
    ) -> None:
        sock = new_socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        super().__init__(sock, rank, key, drops, where)
        self.nonce = os.urandom(wire.NONCE_SIZE)
        self.skey = wire.session_key(key, self.nonce)
        self.expected = expected
        self._check_hello = check_hello
        #: Registered members (after READY), by global rank.
        self.peers: dict[int, Peer] = {}
        self._rid: dict[int, bytes] = {}
        self._rank_of: dict[bytes, int] = {}
        self._pending: dict[bytes, tuple[Peer, int]] = {}
        self._last: dict[int, int] = {}
        self._inbox: dict[int, dict[int, tuple[int, memoryview]]] = {}
        self._unreachable: dict[int, float] = {}
        self._last_probe = 0.0
        self.endpoint = ""

    def bind(self, addr: str) -> str:
        self.sock.bind(addr)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.endpoint

    # --- receiving
    def _recv(self, flags: int) -> Optional[tuple[int, wire.Message]]:
        """One frame: a data message from a registered member, or None when
        the frame was dropped or was part of a handshake. Raises zmq.Again."""
        parts = self.sock.recv_multipart(flags)
        if len(parts) != 2:
            self.drops.drop(f"{len(parts) - 1}-part message", self.where)
            return None
        rid, frame = parts
        try:
            msg = wire.decode(frame, self.key, self.skey)
        except wire.BadFrame as e:
            self.drops.drop(str(e), self.where)
            return None
        rank = self._rank_of.get(rid)
        if rank is None or rank != msg.sender:
            self._handshake(rid, msg)
            return None
        if msg.seq <= self._last[rank]:
            self.drops.drop(f"replayed or out-of-order frame from rank {rank}", self.where)
            return None
        self._last[rank] = msg.seq
        return rank, msg

    def _handshake(self, rid: bytes, msg: wire.Message) -> None:
        if msg.mtype == wire.HELLO:
            try:
                peer, nonce, claimed = unpack_hello(msg.payload)
            except wire.BadFrame as e:
                self.drops.drop(str(e), self.where)
                return
            if claimed != rid or peer.rank != msg.sender or peer.rank in self._rid:
                self.drops.drop("hello replayed or bound to another connection", self.where)
                return
            problem = self._check_hello(peer)
            if problem is not None:
                raise self.abort(DistributedConfigError(problem))
            self._pending[rid] = (peer, msg.seq)
            self._send_one(rid, self.frame(wire.WELCOME, 0, self.nonce + nonce))
        elif msg.mtype == wire.READY:
            pending = self._pending.get(rid)
            if pending is None or pending[0].rank != msg.sender or msg.seq <= pending[1]:
                self.drops.drop("ready without a matching hello", self.where)
                return
            peer = pending[0]
            if peer.rank in self._rid:
                self.drops.drop(f"second connection for rank {peer.rank}", self.where)
                return
            del self._pending[rid]
            self._rid[peer.rank] = rid
            self._rank_of[rid] = peer.rank
            self._last[peer.rank] = msg.seq
            self.peers[peer.rank] = peer
        else:
            self.drops.drop("frame from an unregistered connection", self.where)

    def accept(
        self,
        deadline: Optional[float],
        idle: Callable[[], None],
        start_payload: Callable[[], bytes],
    ) -> None:
        """Wait until ``expected`` members are registered, then START them."""
        while len(self._rid) < self.expected:
            try:
                item = self._recv(0)
            except zmq.Again:
                idle()
                if _deadline_passed(deadline, time.monotonic()):
                    raise self.abort(
                        DistributedError(
                            f"timed out on {self.where}: {len(self._rid)} of {self.expected} "
                            "peers connected"
                        )
                    ) from None
                continue
            if item is not None:
                self._hold(*item)
        self.send_to(self._rid, wire.START, 0, start_payload())

    def _hold(self, rank: int, msg: wire.Message) -> None:
        self._inbox.setdefault(msg.op, {})[rank] = (msg.mtype, msg.payload)

    def collect(
        self,
        op: int,
        want: int,
        senders: Iterable[int],
        deadline: Optional[float],
        probe_for: Callable[[set[int]], Iterable[int]],
        watch: Iterable[Member] = (),
    ) -> dict[int, memoryview]:
        """Contributions of type ``want`` to collective ``op`` from ``senders``."""
        got: dict[int, memoryview] = {}
        missing = set(senders)
        for rank, (mtype, payload) in self._inbox.pop(op, {}).items():
            self._take(op, want, rank, mtype, payload, got, missing)
        recv = self.sock.recv_multipart
        while missing:
            try:
                parts = recv()
            except zmq.Again:
                self._idle(missing, deadline, probe_for, watch)
                continue
            # Fast path: a well-formed frame from a registered member.
            if len(parts) == 2 and parts[0] in self._rank_of:
                try:
                    msg = wire.decode(parts[1], self.key, self.skey)
                except wire.BadFrame as e:
                    self.drops.drop(str(e), self.where)
                    continue
                rank = self._rank_of[parts[0]]
                if rank == msg.sender and msg.seq > self._last[rank]:
                    self._last[rank] = msg.seq
                    if msg.op == op:
                        self._take(op, want, rank, msg.mtype, msg.payload, got, missing)
                    else:
                        self._other_op(op, want, rank, msg)
                    continue
            self._slow(parts, op, want, got, missing)
        return got

    def _slow(
        self, parts: list[bytes], op: int, want: int, got: dict[int, memoryview], missing: set[int]
    ) -> None:
        """Everything the fast path in ``collect`` does not handle: drops,
        handshakes, replays; done by the general receive path."""
        if len(parts) != 2:
            self.drops.drop(f"{len(parts) - 1}-part message", self.where)
            return
        rid, frame = parts
        try:
            msg = wire.decode(frame, self.key, self.skey)
        except wire.BadFrame as e:
            self.drops.drop(str(e), self.where)
            return
        rank = self._rank_of.get(rid)
        if rank is None or rank != msg.sender:
            self._handshake(rid, msg)
        elif msg.seq <= self._last[rank]:
            self.drops.drop(f"replayed or out-of-order frame from rank {rank}", self.where)
        else:  # pragma: no cover - the fast path takes these
            self._last[rank] = msg.seq
            if msg.op == op:
                self._take(op, want, rank, msg.mtype, msg.payload, got, missing)
            else:
                self._other_op(op, want, rank, msg)

    def _take(
        self,
        op: int,
        want: int,
        rank: int,
        mtype: int,
        payload: memoryview,
        got: dict[int, memoryview],
        missing: set[int],
    ) -> None:
        if mtype != want:
            raise self.abort(self._mismatch(op, want, rank, mtype))
        got[rank] = payload
        missing.discard(rank)

    def _other_op(self, op: int, want: int, rank: int, msg: wire.Message) -> None:
        if msg.op > op:  # pragma: no cover - members cannot run ahead today
            self._hold(rank, msg)
            return
        raise self.abort(self._mismatch(op, want, rank, msg.mtype))

    def _mismatch(self, op: int, want: int, rank: int, mtype: int) -> DistributedError:
        theirs = wire.TYPE_NAMES.get(mtype, f"type {mtype}")
        return DistributedError(
            f"collective mismatch on {self.where}: rank {rank} called {theirs} while rank "
            f"{self.rank} called {wire.TYPE_NAMES[want]} (collective #{op & _OP_MASK}); every "
            "rank must call the same collectives in the same order"
        )

    def _idle(
        self,
        missing: set[int],
        deadline: Optional[float],
        probe_for: Callable[[set[int]], Iterable[int]],
        watch: Iterable[Member],
    ) -> None:
        now = time.monotonic()
        for member in watch:
            member.idle_check(now)
        dead = self.probe(probe_for(missing), now)
        if dead:
            raise self.abort(
                DistributedError(
                    f"{format_ranks(dead)} died or became unreachable (detected by rank "
                    f"{self.rank} on {self.where})",
                    dead,
                )
            )
        if _deadline_passed(deadline, now):
            raise self.abort(
                DistributedError(
                    f"timed out on {self.where}: no contribution from {format_ranks(missing)}",
                    missing,
                )
            )

    # --- sending
    def _send_one(self, rid: bytes, frame: Union[bytes, zmq.Frame]) -> bool:
        try:
            self.sock.send(rid, zmq.SNDMORE)
        except zmq.ZMQError as e:
            if _is_unreachable(e):
                return False
            raise
        self.sock.send(frame, copy=False)
        return True

    def send_to(self, ranks: Iterable[int], mtype: int, op: int, payload: bytes = b"") -> None:
        """Send one frame to ``ranks``; a rank whose connection is gone has
        missed a result, so the job is aborted naming it."""
        frame = self.frame(mtype, op, payload)
        data: Union[bytes, zmq.Frame] = zmq.Frame(frame) if len(frame) >= _LARGE else frame
        lost = [rank for rank in ranks if not self._send_one(self._rid[rank], data)]
        if lost and mtype != wire.ABORT:
            raise self.abort(
                DistributedError(
                    f"{format_ranks(lost)} disconnected from {self.where} (seen by rank "
                    f"{self.rank})",
                    lost,
                )
            )

    def probe(self, ranks: Iterable[int], now: float) -> list[int]:
        """Ranks unreachable for at least ``GRACE`` seconds."""
        ranks = [r for r in ranks if r in self._rid]
        if now - self._last_probe >= PROBE_INTERVAL:
            self._last_probe = now
            ping = self.frame(wire.PING, 0)
            for rank in ranks:
                if self._send_one(self._rid[rank], ping):
                    self._unreachable.pop(rank, None)
                else:
                    self._unreachable.setdefault(rank, now)
        return [r for r in ranks if now - self._unreachable.get(r, now) >= GRACE]

    def abort(self, error: DistributedError) -> DistributedError:
        """Tell every member the collectives failed, and return ``error``."""
        body = json.dumps({"error": str(error), "missing": list(error.missing_ranks)})
        try:
            self.send_to(list(self._rid), wire.ABORT, 0, body.encode())
        except zmq.ZMQError:  # pragma: no cover - socket already unusable
            pass
        return error


_OP_MASK = (1 << 62) - 1


# --------------------------------------------------------------------- member
class Member(_Link):
    """The DEALER side: one connection to a hub, watched by a socket monitor."""

    def __init__(
        self, *, rank: int, hub_rank: int, key: bytes, drops: wire.DropLog, where: str, role: str
    ) -> None:
        sock = new_socket(zmq.DEALER)
        super().__init__(sock, rank, key, drops, where)
        self.hub_rank = hub_rank
        self.role = role
        # Random, so another connection cannot claim this member's identity;
        # a leading zero byte is reserved by libzmq.
        self.rid = b"\x01" + os.urandom(15)
        sock.setsockopt(zmq.ROUTING_ID, self.rid)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self.monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._down_since: Optional[float] = None
        self._last = 0
        self._held: deque[wire.Message] = deque()
        self.addr = ""

    def connect(self, addr: str) -> None:
        self.addr = addr
        self.sock.connect(addr)

    def send(self, mtype: int, op: int, payload: bytes = b"") -> None:
        self.sock.send(self.frame(mtype, op, payload))

    def _accept(self, frame: bytes) -> Optional[wire.Message]:
        try:
            msg = wire.decode(frame, self.key, self.skey)
        except wire.BadFrame as e:
            self.drops.drop(str(e), self.where)
            return None
        if msg.sender != self.hub_rank or msg.seq <= self._last:
            self.drops.drop(f"replayed or misattributed frame from rank {msg.sender}", self.where)
            return None
        self._last = msg.seq
        if msg.mtype == wire.ABORT:
            raise self._aborted(msg.payload)
        if msg.mtype == wire.PING:
            return None
        return msg

    def _aborted(self, payload: memoryview) -> DistributedError:
        try:
            info = json.loads(bytes(payload))
            text, missing = str(info["error"]), [int(r) for r in info["missing"]]
        except (ValueError, KeyError, TypeError):
            text, missing = "collectives aborted", []
        return DistributedError(f"{text} (reported to rank {self.rank})", missing)

    def handshake(self, peer: Peer, deadline: Optional[float], idle: Callable[[], None]) -> bytes:
        """HELLO / WELCOME / READY / START; returns START's payload."""
        nonce = os.urandom(wire.NONCE_SIZE)
        self.sock.send(self.frame(wire.HELLO, 0, pack_hello(peer, nonce, self.rid)))
        while self.skey is None:
            msg = self._next(deadline, idle, "a welcome")
            if msg.mtype == wire.WELCOME and bytes(msg.payload[wire.NONCE_SIZE :]) == nonce:
                self.skey = wire.session_key(self.key, bytes(msg.payload[: wire.NONCE_SIZE]))
            else:
                self.drops.drop("stale welcome", self.where)
        self.send(wire.READY, 0)
        while True:
            msg = self._next(deadline, idle, "the start signal")
            if msg.mtype == wire.START:
                return bytes(msg.payload)
            self.drops.drop(f"unexpected {wire.TYPE_NAMES[msg.mtype]} before start", self.where)

    def _next(
        self, deadline: Optional[float], idle: Callable[[], None], what: str
    ) -> wire.Message:
        while True:
            if self._held:
                return self._held.popleft()
            try:
                msg = self._accept(self.sock.recv())
            except zmq.Again:
                idle()
                now = time.monotonic()
                self.idle_check(now)
                if _deadline_passed(deadline, now):
                    raise DistributedError(
                        f"timed out waiting for {what} from rank {self.hub_rank} ({self.role}) "
                        f"at {self.addr}",
                        [self.hub_rank],
                    ) from None
                continue
            if msg is not None:
                return msg

    def wait(
        self,
        op: int,
        want: int,
        deadline: Optional[float],
        watch: Iterable[Member] = (),
    ) -> memoryview:
        """The hub's reply of type ``want`` to collective ``op``."""
        if not self._held:
            # Fast path: the reply is usually the next frame.
            try:
                msg = self._accept(self.sock.recv())
            except zmq.Again:
                msg = None
            if msg is not None and msg.op == op and msg.mtype == want:
                return msg.payload
            if msg is not None:
                self._held.append(msg)

        def idle() -> None:
            now = time.monotonic()
            for member in watch:
                member.idle_check(now)

        msg = self._next(deadline, idle, f"the {wire.TYPE_NAMES[want]} result")
        if msg.op == op and msg.mtype == want:
            return msg.payload
        theirs = wire.TYPE_NAMES.get(msg.mtype, f"type {msg.mtype}")
        raise DistributedError(
            f"collective mismatch on {self.where}: rank {self.hub_rank} called {theirs} while "
            f"rank {self.rank} called {wire.TYPE_NAMES[want]} (collective #{op & _OP_MASK}); "
            "every rank must call the same collectives in the same order"
        )

    def idle_check(self, now: float) -> None:
        """Read pending frames and monitor events; raise if the hub aborted
        the job or has been gone for ``GRACE`` seconds."""
        while True:
            try:
                msg = self._accept(self.sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            if msg is not None:
                self._held.append(msg)
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                break
            if event == zmq.EVENT_CONNECTED:
                self._down_since = None
            elif event == zmq.EVENT_DISCONNECTED and self._down_since is None:
                self._down_since = now
        if self._down_since is not None and now - self._down_since >= GRACE:
            raise DistributedError(
                f"lost the connection to rank {self.hub_rank} ({self.role}) at {self.addr}: it "
                "died or became unreachable",
                [self.hub_rank],
            )

    def close(self, linger_ms: int) -> None:
        if not self.sock.closed:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:  # pragma: no cover
                pass
            self.monitor.close(linger=0)
        super().close(linger_ms)
