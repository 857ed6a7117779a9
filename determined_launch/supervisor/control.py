"""The control channel between the node launchers of one multi-node job.

torchrun, horovodrun and deepspeed only watch their own node, so when a rank
dies on node 1 the ranks on node 0 sit in a collective until a gloo or NCCL
timeout (often 30 minutes). Node launchers therefore keep one TCP connection
each to the chief's launcher and tell it about failures, completion and
preemption requests; the chief tells every node to stop, to preempt, or that
the job has finished. A dropped connection means a dead launcher (the kernel
closes it), heartbeats catch dead hosts.

The wire (HMAC-checked JSON lines) is ``channel.py``; opening its sockets, ``dial.py``.
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from determined_launch.supervisor.channel import (
    AuthenticatedStream,
    derive_key,
    new_nonce,
    read_nonce,
    session_key,
)
from determined_launch.supervisor.dial import ControlError, connect, listen, read_first
from determined_launch.supervisor.events import Kind, Message, message

__all__ = ["ChiefLink", "ControlError", "ControlLink", "NodeLink", "job_identity"]

logger = logging.getLogger("determined_launch.control")

HEARTBEAT_INTERVAL = 1.0
#: A peer silent for this long is declared lost (its host died or hung); also the
#: deadline of a whole handshake.
HEARTBEAT_TIMEOUT = 10.0
#: Connections of the chief's port still in their handshake, at most (each a thread).
_MAX_HANDSHAKES = 64

def _closed(peer: str) -> str:
    """How a lost peer (a launcher; an experiment's worker) is described in the summary."""
    return f"was lost (its connection closed: the {peer} was killed or crashed)"


_SILENT = f"was lost (no heartbeat for {HEARTBEAT_TIMEOUT:g}s)"


class _Pauses:
    """Notices that this process itself did not run (SIGSTOP, starvation):
    a pass of a reader loop (0.5 s each) that took much longer. A peer is
    not judged silent over time this launcher was frozen, and a peer that
    hung up meanwhile is not called killed or crashed: it saw us silent."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.gap = 0.0

    def tick(self) -> bool:
        now = time.monotonic()
        gap, self.last = now - self.last, now
        if gap < HEARTBEAT_TIMEOUT / 2:
            return False
        self.gap = gap
        return True

    def why(self, why: str) -> str:
        if not self.gap:
            return why
        return (f"hung up while this launcher was not running for {self.gap:.0f}s (stopped or "
                f"starved): it saw this launcher silent")


class ControlLink:
    """One side of the channel. Incoming messages land in ``inbox`` (a deque,
    safe to pop from the supervisor's loop); ``deliver`` (``send`` on a node,
    ``broadcast`` on the chief) is thread-safe.

    ``node`` in every message is the sender's container rank; the chief adds
    a ``Kind.LOST`` message (``node``, ``why``) to its inbox when a node disconnects or
    goes silent, and a node adds one for node 0 when the
    chief does.
    """

    def __init__(self, node_rank: int, secret: str, job: str, peer: str) -> None:
        self.node_rank = node_rank
        #: what runs at each end, for messages: "launcher" (det-launch experiment
        #: uses the channel between its workers: "experiment worker")
        self.peer = peer
        self.key = derive_key(secret)
        self.job = job
        self.inbox: collections.deque[Message] = collections.deque()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self._stop.set()

    def deliver(self, message: Message) -> None:
        """Send the way this side sends: the chief to every node, a node to
        the chief. Raises OSError only on a node (the chief's reader threads
        report a broken link themselves)."""
        raise NotImplementedError


class ChiefLink(ControlLink):
    """The chief's side: accepts one connection per non-chief node."""

    def __init__(self, bind_host: str, port: int, num_nodes: int, secret: str, *,
                 peer: str = "launcher") -> None:
        super().__init__(0, secret, job_identity(port, num_nodes), peer)
        self.num_nodes = num_nodes
        self.streams: dict[int, AuthenticatedStream] = {}
        self._lock = threading.Lock()
        self._handshakes = threading.BoundedSemaphore(_MAX_HANDSHAKES)
        self.listener = listen(bind_host, port, peer)
        self._spawn(self._accept_loop)
        self._spawn(self._heartbeat_loop)

    @property
    def connected_nodes(self) -> set[int]:
        with self._lock:
            return set(self.streams)

    def _accept_loop(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            # Unauthenticated peers hold at most _MAX_HANDSHAKES threads, each at most
            # one handshake deadline; more are hung up on at once (a node retries).
            if not self._handshakes.acquire(blocking=False):
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            first = self._handshake(sock)
        finally:
            self._handshakes.release()  # authenticated or gone: no longer a handshake
        if first is not None:
            self._serve_node(*first)

    def _handshake(self, sock: socket.socket
                   ) -> Optional[tuple[AuthenticatedStream, Optional[list[Message]]]]:
        """Nonces, then the first authenticated lines, within ONE deadline for
        the whole exchange (a peer dripping a byte at a time cannot stretch it)."""
        deadline = time.monotonic() + HEARTBEAT_TIMEOUT
        nonce = new_nonce()
        try:
            sock.settimeout(HEARTBEAT_TIMEOUT)
            sock.sendall(f"{nonce}\n".encode())
            theirs = read_nonce(sock, deadline)
        except OSError:
            sock.close()
            return None
        if theirs is None:
            sock.close()
            return None
        stream = AuthenticatedStream(sock, session_key(self.key, self.job, nonce, theirs),
                                     f"{nonce}.{theirs}", is_chief=True)
        try:
            stream.send(message(Kind.HEARTBEAT))  # proves this chief holds the key, now
            return stream, read_first(stream, deadline)
        except OSError:
            stream.close()
            return None

    def _serve_node(self, stream: AuthenticatedStream, first: Optional[list[Message]]) -> None:
        hello = first[0] if first else None
        node = hello.get("node") if hello else None
        if not hello or hello.get("type") != Kind.HELLO or not isinstance(node, int):
            stream.close()
            return
        if not 0 < node < self.num_nodes:
            logger.warning("control channel: rejected a launcher claiming node %s", node)
            stream.close()
            return
        with self._lock:
            if node in self.streams:
                logger.warning("control channel: node %s connected twice; keeping the first", node)
                stream.close()
                return
            self.streams[node] = stream
        self.inbox.append(hello)
        for msg in (first or [])[1:]:  # what came with the hello
            if msg.get("type") != Kind.HEARTBEAT:
                msg["node"] = node
                self.inbox.append(msg)
        why = self._pump(stream, node)
        with self._lock:
            self.streams.pop(node, None)
        if not self._stop.is_set():
            self.inbox.append(message(Kind.LOST, node=node, why=why))

    def _pump(self, stream: AuthenticatedStream, node: int) -> str:
        """Serve one node until it leaves; returns how it was lost."""
        stream.sock.settimeout(0.5)
        last_heard = time.monotonic()
        pauses = _Pauses()
        while not self._stop.is_set():
            msgs = stream.recv_lines()
            if pauses.tick():
                last_heard = time.monotonic()
            if msgs is None:
                stream.close()
                return pauses.why(_closed(self.peer))
            if msgs:
                last_heard = time.monotonic()
            for msg in msgs:
                if msg.get("type") == Kind.BYE:
                    stream.close()
                    return pauses.why(_closed(self.peer))
                if msg.get("type") != Kind.HEARTBEAT:
                    msg["node"] = node  # trust the authenticated connection, not the body
                    self.inbox.append(msg)
            if time.monotonic() - last_heard > HEARTBEAT_TIMEOUT:
                logger.warning("control channel: node %s silent for %.0fs", node, HEARTBEAT_TIMEOUT)
                stream.close()
                return _SILENT
        stream.close()
        return _closed(self.peer)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL):
            self.broadcast(message(Kind.HEARTBEAT))

    def deliver(self, message: Message) -> None:
        self.broadcast(message)

    def broadcast(self, message: Message) -> None:
        with self._lock:
            streams = list(self.streams.items())
        for _, stream in streams:
            try:
                stream.send(message)
            except OSError:
                pass  # the reader thread reports the loss

    def stop_listening(self) -> None:
        """Accept no more nodes, and free the port at once: a shutdown wakes
        the accept loop (a bare close leaves the socket listening until its
        poll times out), so the next generation can bind it right away."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.listener.close()
        except OSError:
            pass
        if self._threads:
            self._threads[0].join(timeout=1.0)  # the accept loop

    def close(self) -> None:
        super().close()
        self.stop_listening()
        with self._lock:
            for stream in self.streams.values():
                stream.close()


class NodeLink(ControlLink):
    """A non-chief node's side: connects to the chief, retrying until
    ``connect_timeout`` because launchers on different nodes start in any order."""

    def __init__(
        self, chief_host: str, port: int, node_rank: int, secret: str, connect_timeout: float,
        *, num_nodes: int, peer: str = "launcher",
    ) -> None:
        super().__init__(node_rank, secret, job_identity(port, num_nodes), peer)
        self.stream, early = connect(
            chief_host, port, key=self.key, job=self.job, node_rank=node_rank, peer=peer,
            timeout=connect_timeout, handshake_timeout=HEARTBEAT_TIMEOUT,
        )
        self.inbox.extend(m for m in early if m.get("type") != Kind.HEARTBEAT)
        self._spawn(self._pump)
        self._spawn(self._heartbeat_loop)

    def _pump(self) -> None:
        try:
            self.stream.sock.settimeout(0.5)
        except OSError:  # closed under us
            self.inbox.append(message(Kind.LOST, node=0, why=_closed(self.peer)))
            return
        last_heard = time.monotonic()
        why = _closed(self.peer)
        pauses = _Pauses()
        while not self._stop.is_set():
            msgs = self.stream.recv_lines()
            if pauses.tick():
                last_heard = time.monotonic()
            if msgs is None:
                why = pauses.why(why)
                break
            if msgs:
                last_heard = time.monotonic()
            self.inbox.extend(m for m in msgs if m.get("type") != Kind.HEARTBEAT)
            if time.monotonic() - last_heard > HEARTBEAT_TIMEOUT:
                why = _SILENT
                break
        if not self._stop.is_set():
            self.inbox.append(message(Kind.LOST, node=0, why=why))

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL):
            try:
                self.send(message(Kind.HEARTBEAT))
            except OSError:
                return

    def send(self, message: Message) -> None:
        self.stream.send(message)

    def deliver(self, message: Message) -> None:
        self.send(message)

    def close(self) -> None:
        super().close()
        try:
            self.stream.send(message(Kind.BYE))
        except OSError:
            pass
        self.stream.close()


def job_identity(port: int, num_nodes: int) -> str:
    """What both ends surely agree on about their job, bound into every
    connection's key. Not the addresses: each node resolves names itself, and
    the chief may listen on another interface than the one nodes reach (NAT)."""
    return f"control port {port}, {num_nodes} nodes"
