"""The collective algorithms of a ``DistributedContext``, over its links.

Flat (the default): each member sends its pickled part to its hub; for an
allgather the hub sends back one pickled list, for a broadcast the hub's
value goes out alone. Hierarchical: local ranks go through their local
chief, which sends one bundle per node to the chief.

Op numbers keep collectives apart: a part sent early for a later
collective is held, never mistaken for this one. Only payloads of
authenticated frames reach ``loads`` (``transport/links`` checks them).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from time import monotonic
from typing import Any, Callable, Optional

from determined_launch.core.distributed.errors import DistributedError
from determined_launch.core.distributed.transport import fused, wire
from determined_launch.core.distributed.transport.hub import Hub
from determined_launch.core.distributed.transport.member import Member
from determined_launch.core.distributed.wiring import Wiring

#: Op ids of *_local collectives, apart from the global ones.
LOCAL_OP = 1 << 62
_BCAST = (wire.BCAST,)


#: C callables, not wrappers: they run for every part. The protocol goes
#: positionally (``dumps(obj, PICKLE)``): a keyword costs a third more per call.
dumps = pickle.dumps
loads = pickle.loads
PICKLE = 5


def run_global(w: Wiring, stuff: Any, kind: int) -> Any:
    payload = b"" if kind == wire.BCAST and w.layout.rank != 0 else dumps(stuff, PICKLE)
    # Numbered only once pickled: an unpicklable object raises before this
    # rank's count moves ahead of the others'.
    w.global_ops += 1
    op = w.global_ops
    if w.hierarchical:
        return _hier(w, op, stuff, payload, kind)
    if w.global_hub is not None:
        return _as_hub(w, w.global_hub, op, stuff, payload, kind, None)
    member = w.global_member
    if member is None:  # pragma: no cover
        raise RuntimeError("no global link")
    return _as_member(w, member, op, stuff, payload, kind, w.layout.rank, _nothing)


def allgather_global(w: Wiring, stuff: Any, kind: int) -> Any:
    """``run_global`` for an allgather, with a member of a flat job going
    straight to its fast path. Why a function of its own: with more ranks
    than cores the members' CPU, not the chief's, bounds an allgather, and
    each Python call on a member's way there measurably costs (about 1 %
    of the whole collective each at 8 ranks on 2 cores), so this one also
    computes the deadline inline rather than through ``Wiring.deadline``."""
    member = w.global_member
    if member is None or w.hierarchical:
        return run_global(w, stuff, kind)
    payload = dumps(stuff, PICKLE)
    w.global_ops += 1
    timeout = w.timeout
    return fused.member_allgather(
        member,
        w.global_ops,
        stuff,
        payload,
        w.layout.rank,
        None if timeout is None else monotonic() + timeout,
        _nothing,
    )


def run_local(w: Wiring, stuff: Any, kind: int) -> Any:
    lay = w.layout
    payload = b"" if kind == wire.BCAST and lay.local_rank != 0 else dumps(stuff, PICKLE)
    w.local_ops += 1
    op = w.local_ops | LOCAL_OP
    hub = w.local_hub or (w.global_hub if lay.cross_size == 1 else None)
    if hub is not None:
        peers = hub.peers
        return _as_hub(w, hub, op, stuff, payload, kind, lambda r: peers[r].local_rank)
    member = w.local_member or w.global_member
    if member is None:  # pragma: no cover
        raise RuntimeError("no local link")
    return _as_member(w, member, op, stuff, payload, kind, lay.local_rank, _nothing)


def _as_hub(
    w: Wiring,
    hub: Hub,
    op: int,
    stuff: Any,
    payload: bytes,
    kind: int,
    index: Optional[Callable[[int], int]],
) -> Any:
    """``index`` maps a member's rank to its place in the result (None: the
    rank itself)."""
    members = list(hub.peers)
    deadline = w.deadline()
    if kind == wire.BCAST:
        hub.send_to(members, wire.BCAST, op, payload, deadline)
        return stuff
    # With one member, an allgather is an exchange: the hub's part is the
    # whole result the member lacks, so send it now, not after the member's
    # part arrives. One trip instead of a round trip.
    eager = kind == wire.AG and len(members) == 1
    if eager:
        hub.send_to(members, wire.PART, op, payload, deadline)
    out = [stuff] * (len(members) + 1)
    fused.collect_into(hub, op, kind, members, deadline, _identity_set, out, index)
    if kind == wire.AG and not eager:
        # The result is one pickled list: one loads on each member is
        # several times cheaper than a loads per contribution.
        fused.send_to(hub, members, wire.RESULT, op, dumps(out, PICKLE), deadline)
    return out


def _as_member(
    w: Wiring,
    member: Member,
    op: int,
    stuff: Any,
    payload: bytes,
    kind: int,
    own_index: int,
    idle: Callable[[], None],
) -> Any:
    deadline = w.deadline()
    if kind == wire.AG:
        return fused.member_allgather(member, op, stuff, payload, own_index, deadline, idle)
    if kind == wire.BCAST:
        return loads(member.exchange(0, op, b"", _BCAST, deadline, idle)[1])
    if kind == wire.GA:
        # No reply: collectives are numbered, so a part sent early for a
        # later gather cannot be confused with this one, and waiting for
        # the chief would only cost this rank a round trip. (Determined's
        # gather waits; nothing in the API promises that it does.)
        member.send(kind, op, payload, deadline)
        return None
    raise ValueError(f"unknown collective {kind}")  # pragma: no cover


def _hier(w: Wiring, op: int, stuff: Any, payload: bytes, kind: int) -> Any:
    """Global collectives via the local chiefs (``hierarchical=True``)."""
    deadline = w.deadline()
    rank = w.layout.rank
    gmember = w.global_member
    if w.layout.local_rank != 0:
        local = w.local_member
        if local is None or gmember is None:  # pragma: no cover
            raise RuntimeError("no local link")
        return _as_member(w, local, op, stuff, payload, kind, rank, w.watch_global)
    lhub = w.local_hub
    if kind == wire.BCAST:
        if gmember is not None:
            payload = bytes(gmember.wait(op, wire.BCAST, deadline))
            stuff = loads(memoryview(payload))
        else:
            _send_global(w, op, wire.BCAST, payload, deadline)
        if lhub is not None:
            lhub.send_to(list(lhub.peers), wire.BCAST, op, payload, deadline)
        return stuff
    parts: dict[int, Any] = {rank: payload}
    if lhub is not None:
        parts.update(
            lhub.collect(op, kind, list(lhub.peers), deadline, _identity_set, w.watch_global)
        )
    node_kind = wire.NODE_AG if kind == wire.AG else wire.NODE_GA
    if gmember is not None:
        gmember.send(node_kind, op, wire.encode_bundle(sorted(parts.items())), deadline)
        if kind == wire.GA:
            return None
        result = bytes(gmember.wait(op, wire.RESULT, deadline))
    else:
        ghub = w.global_hub
        if ghub is None:  # pragma: no cover
            raise RuntimeError("no global link")
        nodes = w.nodes
        got = ghub.collect(
            op,
            node_kind,
            [r for r in nodes if r != 0],
            deadline,
            lambda missing: [r for c in missing for r in nodes[c]],
        )
        for bundle in got.values():
            parts.update(_parts(bundle))
        out = [stuff if r == 0 else loads(p) for r, p in sorted(parts.items())]
        if kind == wire.GA:
            return out
        result = dumps(out, PICKLE)
        _send_global(w, op, wire.RESULT, result, deadline)
    if lhub is not None:
        lhub.send_to(list(lhub.peers), wire.RESULT, op, result, deadline)
    if rank == 0:
        return out
    out = fused.result_list(memoryview(result))
    out[rank] = stuff
    return out


def _send_global(w: Wiring, op: int, mtype: int, payload: bytes, deadline: Optional[float]) -> None:
    """The chief, hierarchical mode: send to the other nodes' local chiefs."""
    if w.global_hub is not None:
        chiefs = [r for r in w.nodes if r != 0]
        w.global_hub.send_to(chiefs, mtype, op, payload, deadline)


def _nothing() -> None:
    pass


def _identity(rank: int) -> int:
    return rank


def _identity_set(missing: set[int]) -> Iterable[int]:
    return missing


def _parts(bundle: Any) -> list[tuple[int, memoryview]]:
    try:
        return wire.decode_bundle(bundle)
    except wire.BadFrame as e:
        raise DistributedError(f"malformed result from an authenticated peer: {e}") from None
