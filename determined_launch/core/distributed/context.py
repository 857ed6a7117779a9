"""``DistributedContext``: allgather, gather and broadcast of Python objects.

The seed's Core API coordination primitives, over ZeroMQ, with three things
Determined's implementation lacks:

- every frame is authenticated (HMAC-SHA256 under the job secret) before
  anything in it is trusted, so nobody who merely reaches a port can make a
  worker unpickle bytes (``wire``);
- a dead peer makes every other rank's collective raise ``DistributedError``
  within seconds, naming the missing ranks, instead of blocking forever
  (``links``);
- ports come from the launcher (``DET_DIST_PORT``) or the caller, a busy
  port is a one-line error, and single-node jobs listen on ipc:// in a
  private directory or on loopback only.

Topology: the chief (rank 0) binds one ROUTER socket and every other rank
connects one DEALER socket to it. When a job spans several nodes, each
node's local chief (local_rank 0) also binds a node-local ROUTER (ipc://
when the launcher provides a private directory) for the ``*_local``
collectives. ``hierarchical=True`` routes the global collectives through
the local chiefs too, so the chief handles one message per node instead of
one per rank.

See docs/distributed.md for the user guide.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

from determined_launch import envvars
from determined_launch.core.distributed import env as _dist_env
from determined_launch.core.distributed.errors import DistributedConfigError, DistributedError
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import LINGER_MS

if TYPE_CHECKING:
    from determined_launch.core.distributed.transport.links import Hub, Member, Peer

__all__ = ["DistributedConfigError", "DistributedContext", "DistributedError", "InsecureWarning"]

logger = logging.getLogger("determined_launch.core.distributed")

_LOCAL_OP = 1 << 62  # op ids of *_local collectives, apart from the global ones
_BCAST, _RESULT = (wire.BCAST,), (wire.RESULT, wire.PART)
_HIERARCHICAL = 1
_UNIX_PATH_MAX = 100  # sun_path is 108 bytes on Linux, 104 on macOS


class InsecureWarning(UserWarning):
    """DistributedContext runs without a secret: messages are not authenticated."""


_warned_insecure = False
_warn_lock = threading.Lock()


def _warn_insecure() -> None:
    global _warned_insecure
    with _warn_lock:
        if _warned_insecure:
            return
        _warned_insecure = True
    warnings.warn(
        f"DistributedContext: no secret ({envvars.DIST_SECRET} unset); messages between ranks "
        "are not authenticated, so any local process that reaches the chief's loopback port "
        "could inject data. Our launchers set a secret; outside them, export "
        f"{envvars.DIST_SECRET} (16+ random characters, the same on every rank).",
        InsecureWarning,
        stacklevel=3,
    )


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _loads(data: wire.Buffer) -> Any:
    return pickle.loads(data)


def _tcp_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _close_links(
    pid: int, links: list[Any], linger: list[int], paths: list[str], locks: list[int]
) -> None:
    """Close sockets and remove socket files; a ``weakref.finalize`` target,
    so it must not reference the context itself. A forked child (a data
    loader worker, say) leaves its parent's sockets and files alone."""
    if os.getpid() != pid:
        return
    for link in links:
        link.close(linger[0])
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    for fd in locks:
        os.close(fd)
    links.clear()
    paths.clear()
    locks.clear()


class DistributedContext:
    """Coordination between the workers of one job.

    ``rank``/``size`` place this worker in the job, ``local_rank``/
    ``local_size`` on its node, ``cross_rank``/``cross_size`` the node in the
    job. ``chief_ip`` (or ``DET_CHIEF_IP``) is the address of rank 0's node,
    required when ``cross_size > 1``.

    Extra keyword arguments (all optional, the environment supplies them
    under our launchers):

    - ``port``: the chief's TCP port (``DET_DIST_PORT``; else
      ``MASTER_PORT + 2``; else 29502). Also names the ipc socket.
    - ``secret``: the job secret for HMAC-SHA256 (``DET_DIST_SECRET``).
    - ``timeout``: seconds one collective (and start-up) may wait before it
      raises ``DistributedError`` (``DET_DIST_TIMEOUT``; default: wait as
      long as the peers are alive).
    - ``ipc_dir``: private 0700 directory for node-local ipc:// sockets
      (``DET_DIST_IPC_DIR``; loopback TCP without it).
    - ``hierarchical``: route global collectives through the local chiefs.
    - ``force_tcp``: never use ipc://.
    - ``transport``: ``"direct"`` (stream sockets, default) or ``"zmq"``
      (``DET_DIST_TRANSPORT``).
    - ``env``: the environment to read instead of ``os.environ``.

    Creating the context is a barrier: it returns once every rank has
    connected. A size-1 context opens no sockets.
    """

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        cross_rank: int,
        cross_size: int,
        chief_ip: Optional[str] = None,
        port: Optional[int] = None,
        secret: Optional[str] = None,
        timeout: Optional[float] = None,
        ipc_dir: Optional[str] = None,
        hierarchical: bool = False,
        force_tcp: bool = False,
        transport: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size
        self._check_layout()
        self._closed = False
        self._failure: Optional[DistributedError] = None
        self._drops = wire.DropLog(logger)
        self._gop = 0
        self._lop = 0
        self.hierarchical = bool(hierarchical) and cross_size > 1
        self._global_hub: Optional[Hub] = None
        self._global_member: Optional[Member] = None
        self._local_hub: Optional[Hub] = None
        self._local_member: Optional[Member] = None
        self._links: list[Any] = []
        self._linger = [0]
        self._paths: list[str] = []
        self._locks: list[int] = []
        #: Chief only, hierarchical mode: local chief rank -> ranks on its node.
        self._nodes: dict[int, list[int]] = {}
        self.chief_ip: Optional[str] = None
        self.port: Optional[int] = None
        self.timeout: Optional[float] = None
        self.transport: Optional[str] = None
        if size == 1:
            return

        env = os.environ if env is None else env
        self.chief_ip = chief_ip or env.get(envvars.CHIEF_IP) or None
        if cross_size > 1 and not self.chief_ip:
            raise DistributedConfigError(
                f"DistributedContext spans {cross_size} nodes but has no chief address; pass "
                f"chief_ip= or set {envvars.CHIEF_IP}"
            )
        self.port = _dist_env.resolve_port(port, env)
        self.timeout = _dist_env.resolve_timeout(timeout, env)
        resolved_secret = _dist_env.resolve_secret(secret, env)
        if resolved_secret is None:
            if cross_size > 1:
                raise DistributedConfigError(
                    f"DistributedContext spans {cross_size} nodes, so it must listen on the "
                    f"network, and refuses to do that without a secret: set {envvars.DIST_SECRET} "
                    "(16+ random characters, the same on every rank) or pass secret="
                )
            _warn_insecure()
        self._key = wire.job_key(resolved_secret)
        self._ipc_dir = None if force_tcp else _dist_env.private_dir(
            ipc_dir or env.get(envvars.DIST_IPC_DIR)
        )
        self.transport = _dist_env.resolve_transport(transport, env)
        self._linger[0] = LINGER_MS
        self._finalizer = weakref.finalize(
            self, _close_links, os.getpid(), self._links, self._linger, self._paths, self._locks
        )
        try:
            self._connect()
        except BaseException:
            self._linger[0] = 0
            self._finalizer()
            raise

    # ------------------------------------------------------------ validation
    def _check_layout(self) -> None:
        fields = {
            "rank": self.rank,
            "size": self.size,
            "local_rank": self.local_rank,
            "local_size": self.local_size,
            "cross_rank": self.cross_rank,
            "cross_size": self.cross_size,
        }
        for name, value in fields.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise DistributedConfigError(f"DistributedContext {name}={value!r} is not an int")
        ok = (
            0 <= self.rank < self.size
            and 0 <= self.local_rank < self.local_size <= self.size
            and 0 <= self.cross_rank < self.cross_size <= self.size
        )
        if ok and self.cross_size == 1:
            ok = self.local_size == self.size and self.local_rank == self.rank
        if not ok:
            raise DistributedConfigError(
                "DistributedContext got an inconsistent layout: "
                + ", ".join(f"{k}={v}" for k, v in fields.items())
            )

    def _peer(self, local_addr: str = "") -> Peer:
        from determined_launch.core.distributed.transport.links import Peer

        return Peer(
            self.rank,
            self.size,
            self.local_rank,
            self.local_size,
            self.cross_rank,
            self.cross_size,
            _HIERARCHICAL if self.hierarchical else 0,
            local_addr,
        )

    def _check_hello(self, peer: Peer) -> Optional[str]:
        mine = self._peer()
        same = (peer.size, peer.cross_size, peer.flags) == (mine.size, mine.cross_size, mine.flags)
        if same and 0 < peer.rank < self.size:
            return None
        return (
            f"rank {peer.rank} started with size {peer.size}, cross_size {peer.cross_size}, "
            f"hierarchical={bool(peer.flags & _HIERARCHICAL)} but rank 0 has size {self.size}, "
            f"cross_size {self.cross_size}, hierarchical={self.hierarchical}; every rank must "
            "agree"
        )

    def _check_local_hello(self, peer: Peer) -> Optional[str]:
        if peer.cross_rank == self.cross_rank and peer.local_size == self.local_size:
            return None
        return (
            f"rank {peer.rank} (node {peer.cross_rank}, local size {peer.local_size}) connected "
            f"to the local chief of node {self.cross_rank} (local size {self.local_size})"
        )

    # -------------------------------------------------------------- sockets
    def _deadline(self) -> Optional[float]:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _global_endpoint(self) -> tuple[str, str]:
        """(address the chief binds, address the others connect to)."""
        if self.cross_size == 1:
            path = self._ipc_path(f"dist-{self.port}.sock")
            if path is not None:
                return f"ipc://{path}", f"ipc://{path}"
            return f"tcp://127.0.0.1:{self.port}", f"tcp://127.0.0.1:{self.port}"
        host = _tcp_host(self.chief_ip or "")
        return f"tcp://{host}:{self.port}", f"tcp://{host}:{self.port}"

    def _ipc_path(self, name: str) -> Optional[str]:
        if self._ipc_dir is None:
            return None
        path = os.path.join(self._ipc_dir, name)
        return path if len(path.encode()) <= _UNIX_PATH_MAX else None

    def _channels(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """(hub channel class, member channel class) of the transport."""
        if self.transport == "zmq":
            from determined_launch.core.distributed.transport import zeromq as _dist_zmq

            return _dist_zmq.ZmqHubChannel, _dist_zmq.ZmqMemberChannel
        from determined_launch.core.distributed.transport import direct as _dist_direct

        return _dist_direct.DirectHubChannel, _dist_direct.DirectMemberChannel

    def _hub(self, where: str, expected: int, check: Callable[[Peer], Optional[str]]) -> Hub:
        from determined_launch.core.distributed.transport.links import Hub

        hub = Hub(
            self._channels()[0](self._drops, where),
            rank=self.rank,
            key=self._key,
            drops=self._drops,
            where=where,
            expected=expected,
            check_hello=check,
        )
        self._links.append(hub)
        return hub

    def _member(self, where: str, hub_rank: int, role: str, addr: str) -> Member:
        from determined_launch.core.distributed.transport.links import Member, new_rid

        rid = new_rid()
        member = Member(
            self._channels()[1](self._drops, where, rid),
            rid,
            rank=self.rank,
            hub_rank=hub_rank,
            key=self._key,
            drops=self._drops,
            where=where,
            role=role,
        )
        self._links.append(member)
        member.connect(addr)
        return member

    def _connect(self) -> None:
        deadline = self._deadline()
        local_addr = ""
        multi_node_local = self.cross_size > 1 and self.local_size > 1
        if multi_node_local and self.local_rank == 0:
            where = f"node {self.cross_rank}'s local link"
            self._local_hub = self._hub(where, self.local_size - 1, self._check_local_hello)
            local_addr = self._bind_local(self._local_hub)

        bind_addr, connect_addr = self._global_endpoint()
        table: dict[str, Any] = {}
        if self.rank == 0:
            hub = self._hub("the global link", self.size - 1, self._check_hello)
            self._global_hub = hub
            self._bind_global(hub, bind_addr)
            hub.accept(deadline, _nothing, lambda: self._start_table(local_addr))
        else:
            member = self._member("the global link", 0, "the chief", connect_addr)
            self._global_member = member
            table = json.loads(member.handshake(self._peer(local_addr), deadline, _nothing))

        if not multi_node_local:
            return
        if self._local_hub is not None:
            self._local_hub.accept(deadline, self._watch_global, lambda: b"{}")
            return
        hub_rank, addr = table["local_hubs"][str(self.cross_rank)]
        where = f"node {self.cross_rank}'s local link"
        self._local_member = self._member(where, hub_rank, "the local chief", addr)
        self._local_member.handshake(self._peer(), deadline, self._watch_global)

    def _watch_global(self) -> None:
        """While waiting on a node-local link: notice the chief's ABORT or death."""
        if self._global_member is not None:
            self._global_member.idle_check(time.monotonic())

    def _bind_global(self, hub: Hub, addr: str) -> None:
        from determined_launch.core.distributed.transport.chan import BindError

        how = "choose a free one with DistributedContext(port=...) or " + envvars.DIST_PORT
        if addr.startswith("ipc://"):
            self._lock_ipc(addr[len("ipc://") :], how)
        try:
            hub.ch.bind(addr)
            return
        except BindError as e:
            if e.in_use:
                raise DistributedConfigError(
                    f"DistributedContext: port {self.port} is already in use ({addr}; another "
                    f"job or DistributedContext?); {how}"
                ) from None
            if self.cross_size == 1:
                raise DistributedConfigError(
                    f"DistributedContext: cannot listen on {addr}: {e}"
                ) from None
        # chief_ip is not an address of this host (NAT, a hostname): all interfaces.
        try:
            hub.ch.bind(f"tcp://*:{self.port}")
        except BindError as e:
            if e.in_use:
                raise DistributedConfigError(
                    f"DistributedContext: port {self.port} is already in use on this host; {how}"
                ) from None
            raise DistributedConfigError(
                f"DistributedContext: cannot listen on port {self.port}: {e}"
            ) from None

    def _lock_ipc(self, path: str, how: str) -> None:
        """A lock file turns a second context on the same ipc name into an
        error (libzmq would silently take the socket file over). A stale
        socket file, from a process that died, is removed."""
        import fcntl

        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DistributedConfigError(
                f"DistributedContext: {path} (port {self.port}) is in use by another "
                f"DistributedContext of this job; {how}"
            ) from None
        self._locks.append(fd)
        self._paths.append(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _bind_local(self, hub: Hub) -> str:
        path = self._ipc_path(f"local-{os.urandom(6).hex()}.sock")
        if path is not None:
            self._paths.append(path)
            return hub.ch.bind(f"ipc://{path}")
        return hub.ch.bind("tcp://127.0.0.1:*")

    def _start_table(self, own_local_addr: str) -> bytes:
        """The chief checks the node layout and tells everyone where each
        node's local chief listens."""
        hub = self._global_hub
        if hub is None:  # pragma: no cover
            raise RuntimeError("only the chief builds the start table")
        peers = [self._peer(own_local_addr), *hub.peers.values()]
        nodes: dict[int, list[Peer]] = {}
        for peer in peers:
            nodes.setdefault(peer.cross_rank, []).append(peer)
        problems = []
        if sorted(nodes) != list(range(self.cross_size)):
            problems.append(f"nodes {sorted(nodes)} reported, expected 0..{self.cross_size - 1}")
        table: dict[str, list[Any]] = {}
        for node, members in sorted(nodes.items()):
            local_ranks = sorted(p.local_rank for p in members)
            if local_ranks != list(range(len(members))) or any(
                p.local_size != len(members) for p in members
            ):
                problems.append(f"node {node} has local ranks {local_ranks}")
                continue
            chief = next(p for p in members if p.local_rank == 0)
            self._nodes[chief.rank] = sorted(p.rank for p in members)
            if len(members) > 1 and self.cross_size > 1:
                table[str(node)] = [chief.rank, chief.local_addr]
        if problems:
            raise hub.abort(
                DistributedConfigError(
                    "DistributedContext: inconsistent node layout: " + "; ".join(problems)
                )
            )
        return json.dumps({"local_hubs": table}).encode()

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the sockets. Idempotent; also done at exit and on GC."""
        if self._closed:
            return
        self._closed = True
        if self.size > 1:
            if self._failure is not None:
                self._linger[0] = 0
            self._finalizer()

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    @property
    def dropped_frames(self) -> int:
        """Frames dropped because they failed authentication or were malformed,
        replayed or out of order. None of them was deserialized."""
        return self._drops.count

    def _usable(self) -> None:
        if self._closed:
            raise DistributedError("DistributedContext is closed")
        if self._failure is not None:
            raise self._failure

    def _run(self, fn: Callable[[Any, int], Any], stuff: Any, kind: int) -> Any:
        self._usable()
        try:
            return fn(stuff, kind)
        except DistributedError as e:
            self._failure = e
            if not e.relayed:
                for member in (self._global_member, self._local_member):
                    if member is not None:
                        member.report(e)
            raise
        except BaseException as e:
            if not isinstance(e, Exception):  # interrupted mid-protocol
                self._failure = DistributedError(f"a collective was interrupted by {e!r}")
            raise

    # ------------------------------------------------------------- getters
    def get_rank(self) -> int:
        """This worker's rank in the job (unique across the job)."""
        return self.rank

    def get_local_rank(self) -> int:
        """This worker's rank on its node."""
        return self.local_rank

    def get_size(self) -> int:
        """Number of workers in the job."""
        return self.size

    def get_local_size(self) -> int:
        """Number of workers on this node."""
        return self.local_size

    def get_cross_rank(self) -> int:
        """Index of this node in the job."""
        return self.cross_rank

    def get_cross_size(self) -> int:
        """Number of nodes in the job."""
        return self.cross_size

    def get_num_agents(self) -> int:
        """Number of nodes (Determined's name for ``get_cross_size``)."""
        return self.cross_size

    # ---------------------------------------------------------- collectives
    def allgather(self, stuff: Any) -> list[Any]:
        """Every rank gets the list of every rank's ``stuff``, ordered by rank."""
        if self.size < 2:
            return [stuff]
        return self._run(self._global, stuff, wire.AG)

    def gather(self, stuff: Any) -> Optional[list[Any]]:
        """The chief gets the list of every rank's ``stuff`` ordered by rank;
        other ranks get ``None`` once the chief has everything."""
        if self.size < 2:
            return [stuff]
        return self._run(self._global, stuff, wire.GA)

    def broadcast(self, stuff: Any) -> Any:
        """Every rank gets the chief's ``stuff``; other ranks' argument is ignored."""
        if self.size < 2:
            return stuff
        return self._run(self._global, stuff, wire.BCAST)

    def allgather_local(self, stuff: Any) -> list[Any]:
        """Like ``allgather`` among the workers of this node, ordered by local rank."""
        if self.local_size < 2:
            return [stuff]
        return self._run(self._local, stuff, wire.AG)

    def gather_local(self, stuff: Any) -> Optional[list[Any]]:
        """Like ``gather`` to this node's local chief (local rank 0)."""
        if self.local_size < 2:
            return [stuff]
        return self._run(self._local, stuff, wire.GA)

    def broadcast_local(self, stuff: Any = None) -> Any:
        """Every worker of this node gets its local chief's ``stuff``."""
        if self.local_size < 2:
            return stuff
        return self._run(self._local, stuff, wire.BCAST)

    # --------------------------------------------------------- the protocol
    def _global(self, stuff: Any, kind: int) -> Any:
        payload = b"" if kind == wire.BCAST and self.rank != 0 else _dumps(stuff)
        self._gop += 1
        if self.hierarchical:
            return self._hier(self._gop, stuff, payload, kind)
        if self._global_hub is not None:
            return self._as_hub(
                self._global_hub, self._gop, stuff, payload, kind, self.rank, _identity
            )
        member = self._global_member
        if member is None:  # pragma: no cover
            raise RuntimeError("no global link")
        return self._as_member(member, self._gop, stuff, payload, kind, self.rank, _nothing)

    def _local(self, stuff: Any, kind: int) -> Any:
        payload = b"" if kind == wire.BCAST and self.local_rank != 0 else _dumps(stuff)
        self._lop += 1
        op = self._lop | _LOCAL_OP
        hub = self._local_hub or (self._global_hub if self.cross_size == 1 else None)
        if hub is not None:
            peers = hub.peers
            return self._as_hub(
                hub, op, stuff, payload, kind, self.local_rank, lambda r: peers[r].local_rank
            )
        member = self._local_member or self._global_member
        if member is None:  # pragma: no cover
            raise RuntimeError("no local link")
        return self._as_member(member, op, stuff, payload, kind, self.local_rank, _nothing)

    def _as_hub(
        self,
        hub: Hub,
        op: int,
        stuff: Any,
        payload: bytes,
        kind: int,
        own_index: int,
        index: Callable[[int], int],
    ) -> Any:
        members = list(hub.peers)
        deadline = self._deadline()
        if kind == wire.BCAST:
            hub.send_to(members, wire.BCAST, op, payload, deadline)
            return stuff
        # With one member, an allgather is an exchange: the hub's part is
        # the whole result the member lacks, so send it now, not after the
        # member's part arrives. One trip instead of a round trip.
        eager = kind == wire.AG and len(members) == 1
        if eager:
            hub.send_to(members, wire.PART, op, payload, deadline)
        out = [stuff] * (len(members) + 1)

        def unpickle(rank: int, part: memoryview) -> None:
            out[index(rank)] = _loads(part)

        hub.collect(op, kind, members, deadline, _identity_set, each=unpickle)
        if kind == wire.AG and not eager:
            # The result is one pickled list: one loads on each member is
            # several times cheaper than a loads per contribution.
            hub.send_to(members, wire.RESULT, op, _dumps(out), deadline)
        return out

    def _as_member(
        self,
        member: Member,
        op: int,
        stuff: Any,
        payload: bytes,
        kind: int,
        own_index: int,
        idle: Callable[[], None],
    ) -> Any:
        deadline = self._deadline()
        if kind == wire.BCAST:
            return _loads(member.exchange(0, op, b"", _BCAST, deadline, idle)[1])
        if kind == wire.GA:
            # No reply: collectives are numbered, so a part sent early for a
            # later gather cannot be confused with this one, and waiting for
            # the chief would only cost this rank a round trip. (Determined's
            # gather waits; nothing in the API promises that it does.)
            member.send(kind, op, payload, deadline)
            return None
        mtype, reply = member.exchange(kind, op, payload, _RESULT, deadline, idle)
        if mtype == wire.PART:  # the two-rank exchange: the hub's part only
            return [_loads(reply), stuff] if own_index else [stuff, _loads(reply)]
        out = _result_list(reply)
        out[own_index] = stuff
        return out

    def _hier(self, op: int, stuff: Any, payload: bytes, kind: int) -> Any:
        """Global collectives via the local chiefs (``hierarchical=True``)."""
        deadline = self._deadline()
        gmember = self._global_member
        if self.local_rank != 0:
            local = self._local_member
            if local is None or gmember is None:  # pragma: no cover
                raise RuntimeError("no local link")
            return self._as_member(local, op, stuff, payload, kind, self.rank, self._watch_global)
        lhub = self._local_hub
        if kind == wire.BCAST:
            if gmember is not None:
                payload = bytes(gmember.wait(op, wire.BCAST, deadline))
                stuff = _loads(memoryview(payload))
            else:
                self._send_global(op, wire.BCAST, payload, deadline)
            if lhub is not None:
                lhub.send_to(list(lhub.peers), wire.BCAST, op, payload, deadline)
            return stuff
        parts: dict[int, Any] = {self.rank: payload}
        if lhub is not None:
            parts.update(
                lhub.collect(
                    op, kind, list(lhub.peers), deadline, _identity_set, self._watch_global
                )
            )
        node_kind = wire.NODE_AG if kind == wire.AG else wire.NODE_GA
        if gmember is not None:
            gmember.send(node_kind, op, wire.encode_bundle(sorted(parts.items())), deadline)
            if kind == wire.GA:
                return None
            result = bytes(gmember.wait(op, wire.RESULT, deadline))
        else:
            ghub = self._global_hub
            if ghub is None:  # pragma: no cover
                raise RuntimeError("no global link")
            chiefs = [r for r in self._nodes if r != 0]
            nodes = self._nodes
            got = ghub.collect(
                op,
                node_kind,
                chiefs,
                deadline,
                lambda missing: [r for c in missing for r in nodes[c]],
            )
            for bundle in got.values():
                parts.update(_parts(bundle))
            out = [stuff if r == 0 else _loads(p) for r, p in sorted(parts.items())]
            if kind == wire.GA:
                return out
            result = _dumps(out)
            self._send_global(op, wire.RESULT, result, deadline)
        if lhub is not None:
            lhub.send_to(list(lhub.peers), wire.RESULT, op, result, deadline)
        if self.rank == 0:
            return out
        out = _result_list(memoryview(result))
        out[self.rank] = stuff
        return out

    def _send_global(
        self, op: int, mtype: int, payload: bytes, deadline: Optional[float]
    ) -> None:
        """The chief, hierarchical mode: send to the other nodes' local chiefs."""
        if self._global_hub is not None:
            chiefs = [r for r in self._nodes if r != 0]
            self._global_hub.send_to(chiefs, mtype, op, payload, deadline)

    # -------------------------------------------------------- constructors
    @classmethod
    def from_env(
        cls, chief_ip: Optional[str] = None, env: Optional[Mapping[str, str]] = None, **kwargs: Any
    ) -> DistributedContext:
        """Detect the rank layout from the launcher's variables: torchrun,
        DeepSpeed, Horovod, OpenMPI, PMI (MPICH/Intel MPI) or SLURM, in that
        order. No launcher variables: a size-1 context."""
        env = os.environ if env is None else env
        layout = _dist_env.detect(env)
        if layout is None:
            return cls(
                rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, **kwargs
            )
        if chief_ip is None:
            _dist_env.check_chief_resolves(layout, env)
        return cls._from_layout(layout, chief_ip, env, kwargs)

    @classmethod
    def from_torch_distributed(
        cls, chief_ip: Optional[str] = None, **kwargs: Any
    ) -> DistributedContext:
        """From torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``). The chief
        address is ``chief_ip``, ``DET_CHIEF_IP`` or ``MASTER_ADDR``."""
        env = kwargs.pop("env", None)
        env = os.environ if env is None else env
        layout = _dist_env.read_torchrun(env)
        if layout is None:
            raise DistributedConfigError(
                "from_torch_distributed: RANK and LOCAL_WORLD_SIZE are not set; run under "
                "torchrun (or det-launch torch)"
            )
        return cls._from_layout(layout, chief_ip, env, kwargs)

    @classmethod
    def from_deepspeed(cls, chief_ip: Optional[str] = None, **kwargs: Any) -> DistributedContext:
        """From the DeepSpeed launcher's variables (``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, ``LOCAL_SIZE``, ``CROSS_RANK``, ``CROSS_SIZE``), or
        torchrun's when DeepSpeed was started by torchrun."""
        env = kwargs.pop("env", None)
        env = os.environ if env is None else env
        layout = _dist_env.read_deepspeed(env) or _dist_env.read_torchrun(env)
        if layout is None:
            raise DistributedConfigError(
                "from_deepspeed: RANK and CROSS_RANK (or LOCAL_WORLD_SIZE) are not set; run "
                "under the deepspeed launcher"
            )
        return cls._from_layout(layout, chief_ip, env, kwargs)

    @classmethod
    def from_horovod(
        cls, hvd: Any, chief_ip: Optional[str] = None, **kwargs: Any
    ) -> DistributedContext:
        """From an initialized Horovod module (``import horovod.torch as hvd;
        hvd.init()``)."""
        return cls(
            rank=hvd.rank(),
            size=hvd.size(),
            local_rank=hvd.local_rank(),
            local_size=hvd.local_size(),
            cross_rank=hvd.cross_rank(),
            cross_size=hvd.cross_size(),
            chief_ip=chief_ip,
            **kwargs,
        )

    @classmethod
    def _from_layout(
        cls,
        layout: _dist_env.Layout,
        chief_ip: Optional[str],
        env: Mapping[str, str],
        kwargs: dict[str, Any],
    ) -> DistributedContext:
        return cls(
            rank=layout.rank,
            size=layout.size,
            local_rank=layout.local_rank,
            local_size=layout.local_size,
            cross_rank=layout.cross_rank,
            cross_size=layout.cross_size,
            chief_ip=chief_ip or layout.chief_ip,
            env=env,
            **kwargs,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "failed" if self._failure else "open"
        return (
            f"DistributedContext(rank={self.rank}, size={self.size}, local_rank="
            f"{self.local_rank}, local_size={self.local_size}, cross_rank={self.cross_rank}, "
            f"cross_size={self.cross_size}, {state})"
        )


def _nothing() -> None:
    pass


def _identity(rank: int) -> int:
    return rank


def _identity_set(missing: set[int]) -> Iterable[int]:
    return missing


def _result_list(payload: memoryview) -> list[Any]:
    out = _loads(payload)
    if not isinstance(out, list):
        raise DistributedError(f"malformed result from an authenticated peer: {type(out)}")
    return out


def _parts(bundle: Any) -> list[tuple[int, memoryview]]:
    try:
        return wire.decode_bundle(bundle)
    except wire.BadFrame as e:
        raise DistributedError(f"malformed result from an authenticated peer: {e}") from None

