"""Setting up and tearing down a ``DistributedContext``'s links.

Topology: the chief (rank 0) runs the global hub and every other rank
connects a member to it. When a job spans several nodes, each node's local
chief (local_rank 0) also runs a node-local hub (a Unix socket when the
launcher provides a private directory) for the ``*_local`` collectives;
the chief's start table tells every rank where its local chief listens.

Kept apart from ``context`` so the public class holds only the API, and
from ``ops`` so the collective algorithms read without the socket set-up.
Nothing here refers back to the context: ``close`` is the context's
``weakref.finalize`` target.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Optional

from determined_launch import envvars
from determined_launch.core.distributed.env import Layout
from determined_launch.core.distributed.errors import DistributedConfigError, DistributedError
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import LINGER_MS, BindError
from determined_launch.core.distributed.transport.hub import Hub
from determined_launch.core.distributed.transport.links import Peer, new_rid
from determined_launch.core.distributed.transport.member import Member

HIERARCHICAL = 1  # Peer.flags bit: this rank runs global collectives via its local chief
_UNIX_PATH_MAX = 100  # sun_path is 108 bytes on Linux, 104 on macOS
_PORT_HOW = "choose a free one with DistributedContext(port=...) or " + envvars.DIST_PORT


def _tcp_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def note_lost_peers(rank: int, peers: tuple[int, ...],
                    env: Optional[dict[str, str]] = None) -> None:
    """Tell our launcher that this rank's failure is a consequence of ``peers``
    vanishing. Why: the peer that died first may take longer to exit (its
    interpreter's teardown) than this rank takes to notice and exit, and the
    launcher orders failures by exit time; this note keeps it from naming the
    rank that only noticed. Outside our launchers, and on any error: nothing."""
    status_dir = (os.environ if env is None else env).get(envvars.WRAP_RANK_STATUS_DIR)
    others = sorted({p for p in peers if p != rank})[:32]  # a file name stays short
    if not status_dir or not others:
        return
    name = envvars.RANK_LOST_FILE.format(rank=rank, peers=",".join(map(str, others)))
    try:
        os.close(os.open(os.path.join(status_dir, name),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass  # a hint for the summary, never a reason to fail differently


def _nothing() -> None:
    pass


class Wiring:
    """The hubs and members of one context, and the files behind them."""

    def __init__(
        self,
        layout: Layout,
        *,
        hierarchical: bool,
        chief_ip: Optional[str],
        port: int,
        timeout: Optional[float],
        key: wire.MacKey,
        drops: wire.DropLog,
        ipc_dir: Optional[str],
        transport: str,
    ) -> None:
        self.layout = layout
        self.hierarchical = hierarchical
        self.chief_ip = chief_ip
        self.port = port
        self.timeout = timeout
        self.key = key
        self.drops = drops
        self.ipc_dir = ipc_dir
        self.transport = transport
        self.global_hub: Optional[Hub] = None
        self.global_member: Optional[Member] = None
        self.local_hub: Optional[Hub] = None
        self.local_member: Optional[Member] = None
        #: Collectives run so far, global and node-local: their op numbers.
        self.global_ops = 0
        self.local_ops = 0
        #: Chief only, hierarchical mode: local chief rank -> ranks on its node.
        self.nodes: dict[int, list[int]] = {}
        #: How long close() lets undelivered ZeroMQ frames hold up exit.
        self.linger_ms = LINGER_MS
        self.links: list[Any] = []
        self._paths: list[str] = []
        self._locks: list[int] = []

    # ------------------------------------------------------------ hellos
    def peer(self, local_addr: str = "") -> Peer:
        lay = self.layout
        flags = HIERARCHICAL if self.hierarchical else 0
        return Peer(
            lay.rank, lay.size, lay.local_rank, lay.local_size, lay.cross_rank, lay.cross_size,
            flags, local_addr,
        )

    def _check_hello(self, peer: Peer) -> Optional[str]:
        mine = self.peer()
        same = (peer.size, peer.cross_size, peer.flags) == (mine.size, mine.cross_size, mine.flags)
        if same and 0 < peer.rank < mine.size:
            return None
        return (
            f"rank {peer.rank} started with size {peer.size}, cross_size {peer.cross_size}, "
            f"hierarchical={bool(peer.flags & HIERARCHICAL)} but rank 0 has size {mine.size}, "
            f"cross_size {mine.cross_size}, hierarchical={self.hierarchical}; every rank must "
            "agree"
        )

    def _check_local_hello(self, peer: Peer) -> Optional[str]:
        lay = self.layout
        if peer.cross_rank == lay.cross_rank and peer.local_size == lay.local_size:
            return None
        return (
            f"rank {peer.rank} (node {peer.cross_rank}, local size {peer.local_size}) connected "
            f"to the local chief of node {lay.cross_rank} (local size {lay.local_size})"
        )

    # ------------------------------------------------------------ sockets
    def deadline(self) -> Optional[float]:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _global_endpoint(self) -> str:
        if self.layout.cross_size == 1:
            path = self._ipc_path(f"dist-{self.port}.sock")
            return f"ipc://{path}" if path is not None else f"tcp://127.0.0.1:{self.port}"
        return f"tcp://{_tcp_host(self.chief_ip or '')}:{self.port}"

    def _ipc_path(self, name: str) -> Optional[str]:
        if self.ipc_dir is None:
            return None
        path = os.path.join(self.ipc_dir, name)
        return path if len(path.encode()) <= _UNIX_PATH_MAX else None

    def _channels(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """(hub channel class, member channel class) of the transport."""
        if self.transport == "zmq":
            from determined_launch.core.distributed.transport import zeromq

            return zeromq.ZmqHubChannel, zeromq.ZmqMemberChannel
        from determined_launch.core.distributed.transport import direct, direct_member

        return direct.DirectHubChannel, direct_member.DirectMemberChannel

    def _hub(self, where: str, expected: int, check: Callable[[Peer], Optional[str]]) -> Hub:
        hub = Hub(
            self._channels()[0](self.drops, where),
            rank=self.layout.rank,
            key=self.key,
            drops=self.drops,
            where=where,
            expected=expected,
            check_hello=check,
        )
        self.links.append(hub)
        return hub

    def _member(self, where: str, hub_rank: int, role: str, addr: str) -> Member:
        rid = new_rid()
        member = Member(
            self._channels()[1](self.drops, where, rid),
            rid,
            rank=self.layout.rank,
            hub_rank=hub_rank,
            key=self.key,
            drops=self.drops,
            where=where,
            role=role,
        )
        self.links.append(member)
        member.connect(addr)
        return member

    def connect(self) -> None:
        """Open every link; returns when every rank has connected."""
        lay = self.layout
        deadline = self.deadline()
        local_addr = ""
        multi_node_local = lay.cross_size > 1 and lay.local_size > 1
        if multi_node_local and lay.local_rank == 0:
            where = f"node {lay.cross_rank}'s local link"
            self.local_hub = self._hub(where, lay.local_size - 1, self._check_local_hello)
            local_addr = self._bind_local(self.local_hub)

        addr = self._global_endpoint()
        table: dict[str, Any] = {}
        if lay.rank == 0:
            hub = self._hub("the global link", lay.size - 1, self._check_hello)
            self.global_hub = hub
            self._bind_global(hub, addr)
            hub.accept(deadline, _nothing, lambda: self._start_table(local_addr))
        else:
            member = self._member("the global link", 0, "the chief", addr)
            self.global_member = member
            table = json.loads(member.handshake(self.peer(local_addr), deadline, _nothing))

        if not multi_node_local:
            return
        if self.local_hub is not None:
            self.local_hub.accept(deadline, self.watch_global, lambda: b"{}")
            return
        hub_rank, local = table["local_hubs"][str(lay.cross_rank)]
        where = f"node {lay.cross_rank}'s local link"
        self.local_member = self._member(where, hub_rank, "the local chief", local)
        self.local_member.handshake(self.peer(), deadline, self.watch_global)

    def watch_global(self) -> None:
        """While waiting on a node-local link: notice the chief's ABORT or death."""
        if self.global_member is not None:
            self.global_member.idle_check(time.monotonic())

    def _bind_global(self, hub: Hub, addr: str) -> None:
        if addr.startswith("ipc://"):
            self._lock_ipc(addr[len("ipc://") :])
        try:
            hub.ch.bind(addr)
            return
        except BindError as e:
            if e.in_use:
                raise DistributedConfigError(
                    f"DistributedContext: port {self.port} is already in use ({addr}; another "
                    f"job or DistributedContext?); {_PORT_HOW}"
                ) from None
            if self.layout.cross_size == 1:
                raise DistributedConfigError(
                    f"DistributedContext: cannot listen on {addr}: {e}"
                ) from None
        # chief_ip is not an address of this host (NAT, a hostname): all interfaces.
        try:
            hub.ch.bind(f"tcp://*:{self.port}")
        except BindError as e:
            if e.in_use:
                raise DistributedConfigError(
                    f"DistributedContext: port {self.port} is already in use on this host; "
                    + _PORT_HOW
                ) from None
            raise DistributedConfigError(
                f"DistributedContext: cannot listen on port {self.port}: {e}"
            ) from None

    def _lock_ipc(self, path: str) -> None:
        """A lock file turns a second context on the same socket name into an
        error (binding would silently take the socket file over). A stale
        socket file, from a process that died, is removed."""
        import fcntl

        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DistributedConfigError(
                f"DistributedContext: {path} (port {self.port}) is in use by another "
                f"DistributedContext of this job; {_PORT_HOW}"
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
        hub = self.global_hub
        if hub is None:  # pragma: no cover
            raise RuntimeError("only the chief builds the start table")
        cross_size = self.layout.cross_size
        nodes: dict[int, list[Peer]] = {}
        for peer in [self.peer(own_local_addr), *hub.peers.values()]:
            nodes.setdefault(peer.cross_rank, []).append(peer)
        problems = []
        if sorted(nodes) != list(range(cross_size)):
            problems.append(f"nodes {sorted(nodes)} reported, expected 0..{cross_size - 1}")
        table: dict[str, list[Any]] = {}
        for node, members in sorted(nodes.items()):
            local_ranks = sorted(p.local_rank for p in members)
            if local_ranks != list(range(len(members))) or any(
                p.local_size != len(members) for p in members
            ):
                problems.append(f"node {node} has local ranks {local_ranks}")
                continue
            chief = next(p for p in members if p.local_rank == 0)
            self.nodes[chief.rank] = sorted(p.rank for p in members)
            if len(members) > 1 and cross_size > 1:
                table[str(node)] = [chief.rank, chief.local_addr]
        if problems:
            raise hub.abort(
                DistributedConfigError(
                    "DistributedContext: inconsistent node layout: " + "; ".join(problems)
                )
            )
        return json.dumps({"local_hubs": table}).encode()

    # ------------------------------------------------------------ failures
    def failed(self, e: BaseException) -> Optional[DistributedError]:
        """What a collective's exception means for this job: the failure
        that ends it everywhere (reported to the hubs unless it came from
        them), or None for an error that left the protocol intact (an
        unpicklable object raises before this rank's op count moves)."""
        if isinstance(e, DistributedError):
            if not e.relayed:
                for member in (self.global_member, self.local_member):
                    if member is not None:
                        member.report(e)
            note_lost_peers(self.layout.rank, e.missing_ranks)
            return e
        if not isinstance(e, Exception):  # interrupted mid-protocol
            return DistributedError(f"a collective was interrupted by {e!r}")
        return None

    # ------------------------------------------------------------ teardown
    def close(self, pid: int) -> None:
        """Close sockets and remove socket files. A forked child (a data
        loader worker, say) leaves its parent's sockets and files alone."""
        if os.getpid() != pid:
            return
        for link in self.links:
            link.close(self.linger_ms)
        for path in self._paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        for fd in self._locks:
            os.close(fd)
        self.links.clear()
        self._paths.clear()
        self._locks.clear()
