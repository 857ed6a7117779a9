"""The link protocol of a ``DistributedContext``: one hub, many members.

A *hub* (the chief, or a node's local chief) listens; each *member*
connects to it. The transport underneath is a channel (``chan``):
stdlib sockets or ZeroMQ. Everything that decides what to trust lives in
this module (what both ends share: HELLO, keys, sequence numbers) and in
``hub`` and ``member`` (each end's half of the protocol).

Handshake (per link, at start-up)::

    member -> hub   HELLO  (job key)     rank layout, member nonce, routing id
    hub -> member   WELCOME (job key)    hub nonce + the member's nonce echoed
    member -> hub   READY  (session key) proves the member is live now
    hub -> members  START  (session key) once every expected member is READY

The session key is derived from the hub's fresh nonce, so a HELLO replayed
from an earlier job (same secret) never gets past READY. The routing id is
random per connection and bound into HELLO, so frames replayed from another
connection are not attributed to the rank they name. The hub only sends to
members it has heard from, so no message is lost to a receiver that has
not connected yet (the PUB/SUB "slow joiner" problem).

Failure detection needs no Python thread:

- a member asks its channel whether the hub's connection is gone; gone
  for the channel's ``grace`` (0 for plain sockets, 2 s for ZeroMQ, which
  reconnects) means the hub (the chief or a local chief) is dead;
- a hub waiting for contributions checks the missing ranks every
  ``hub.PROBE_INTERVAL``; unreachable for ``grace`` means dead. The hub then
  sends ABORT, naming the missing ranks, to every member and raises.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Optional, Union

from determined_launch.core.distributed.errors import DistributedError
from determined_launch.core.distributed.transport import wire

#: Mask of the collective counter in an op id (the top bits mark the scope).
OP_MASK = (1 << 62) - 1


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


def new_rid() -> bytes:
    """A random routing id; a leading zero byte is reserved by libzmq."""
    return b"\x01" + os.urandom(15)


def error_body(error: DistributedError) -> bytes:
    return json.dumps({"error": str(error), "missing": list(error.missing_ranks)}).encode()


def error_info(payload: memoryview) -> tuple[str, list[int]]:
    try:
        info = json.loads(bytes(payload))
        return str(info["error"]), [int(r) for r in info["missing"]]
    except (ValueError, KeyError, TypeError):
        return "collectives aborted", []


def deadline_passed(deadline: Optional[float], now: float) -> bool:
    return deadline is not None and now >= deadline


def mismatch(where: str, op: int, rank: int, theirs: int, mine_rank: int, mine: int) -> str:
    return (
        f"collective mismatch on {where}: rank {rank} called "
        f"{wire.TYPE_NAMES.get(theirs, f'type {theirs}')} while rank {mine_rank} called "
        f"{wire.TYPE_NAMES[mine]} (collective #{op & OP_MASK}); every rank must call the same "
        "collectives in the same order"
    )


class Link:
    """What hubs and members share: keys, a send sequence, the drop log."""

    def __init__(self, rank: int, key: wire.MacKey, drops: wire.DropLog, where: str) -> None:
        self.rank = rank
        self.key = key
        self.skey: Optional[wire.MacKey] = None
        self.drops = drops
        self.where = where
        self._seq = 0

    def frame(self, mtype: int, op: int, payload: bytes = b"") -> bytes:
        self._seq += 1
        key = self.key if mtype in (wire.HELLO, wire.WELCOME) else self.skey
        if key is None:  # pragma: no cover - internal ordering error
            raise RuntimeError("session frame before handshake")
        return wire.encode(key, mtype, self.rank, self._seq, op, payload)
