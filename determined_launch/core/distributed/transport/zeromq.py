"""ZeroMQ channels for ``DistributedContext`` links (``transport="zmq"``).

The hub binds a ROUTER socket, each member connects a DEALER. ROUTER/DEALER
is bidirectional, so one port carries contributions up and results down,
and the hub only ever sends to members it has heard from: there is no
PUB/SUB "slow joiner" window, which is what Determined's repeated-hello
loop works around.

Liveness without a Python thread: libzmq's I/O thread exchanges ZMTP
heartbeats on every connection (a silent peer is disconnected after
``HEARTBEAT_TIMEOUT``) and process death closes the socket at once.

- A member reads its socket monitor: the hub disconnected for ``grace``
  seconds (libzmq keeps trying to reconnect meanwhile) means it is gone.
- The hub probes a member by sending it a PING under ``ROUTER_MANDATORY``:
  when the member's connection is gone, the send fails with
  ``EHOSTUNREACH``.
"""

from __future__ import annotations

import atexit
import errno
import os
import threading
from typing import Any, Optional, Union

import zmq
from zmq.utils.monitor import recv_monitor_message

from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import (
    LINGER_MS,
    SLICE_MS,
    BindError,
    IdleTimeout,
)

_SOCKOPTS = {
    zmq.SNDHWM: 0,  # never drop or block a result because a peer is busy computing
    zmq.RCVHWM: 0,
    zmq.RCVTIMEO: SLICE_MS,
    zmq.LINGER: LINGER_MS,
    zmq.HEARTBEAT_IVL: 1000,
    zmq.HEARTBEAT_TIMEOUT: 4000,
    zmq.HEARTBEAT_TTL: 6000,
    # a connection that has not finished ZMTP's greeting within 10 s is closed
    # (libzmq's default is 30 s), as the direct transport and the control port do
    zmq.HANDSHAKE_IVL: 10000,
}
_LARGE = 64 * 1024  # frames at least this big are shared by the sends to each member

_zctx: Optional[zmq.Context[Any]] = None
_zctx_pid = 0
_zctx_lock = threading.Lock()


def zmq_context() -> zmq.Context[Any]:
    """One zmq context per process (re-created after fork), destroyed at exit.

    ``destroy`` rather than ``term``: it closes any socket still open, with
    the bounded linger above, instead of waiting for it forever.
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


def _socket(kind: int) -> zmq.Socket[Any]:
    sock = zmq_context().socket(kind)
    for opt, value in _SOCKOPTS.items():
        sock.setsockopt(opt, value)
    return sock


def _ipv6(sock: zmq.Socket[Any], addr: str) -> None:
    if addr.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)


class ZmqHubChannel:
    grace = 2.0

    def __init__(self, drops: wire.DropLog, where: str) -> None:
        self.sock = _socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._drops = drops
        self._where = where

    def bind(self, addr: str) -> str:
        _ipv6(self.sock, addr)
        try:
            self.sock.bind(addr)
        except zmq.ZMQError as e:
            raise BindError(e.errno == errno.EADDRINUSE, str(e)) from None
        endpoint: str = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return endpoint

    def recv(self, block: bool) -> Optional[tuple[bytes, bytes]]:
        try:
            parts = self.sock.recv_multipart(0 if block else zmq.NOBLOCK)
        except zmq.Again:
            raise IdleTimeout from None
        if len(parts) != 2:
            self._drops.drop(f"{len(parts) - 1}-part message", self._where)
            return None
        return parts[0], parts[1]

    def send(self, peer: bytes, frame: Union[bytes, zmq.Frame]) -> bool:
        try:
            self.sock.send(peer, zmq.SNDMORE)
        except zmq.ZMQError as e:
            if e.errno == errno.EHOSTUNREACH:
                return False
            raise
        self.sock.send(frame, copy=False)
        return True

    def send_many(
        self, peers: list[bytes], frame: bytes, deadline: Optional[float] = None
    ) -> list[bytes]:
        # A large frame is copied once into memory libzmq owns and shared by
        # every send; zero-copy from the Python object would not survive
        # interpreter exit while the frame still lingers.
        data: Union[bytes, zmq.Frame] = frame
        if len(frame) >= _LARGE:
            data = zmq.Frame(frame, copy=True)
        return [peer for peer in peers if not self.send(peer, data)]

    def reachable(self, peer: bytes, ping: bytes) -> bool:
        return self.send(peer, ping)

    def trust(self, peer: bytes) -> None:
        """Nothing to do: zmq frames are size-limited by the socket."""

    def close(self, linger_ms: int) -> None:
        if not self.sock.closed:
            self.sock.close(linger=linger_ms)


class ZmqMemberChannel:
    grace = 2.0

    def __init__(self, drops: wire.DropLog, where: str, rid: bytes) -> None:
        self.sock = _socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, rid)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._down_since: Optional[float] = None

    def connect(self, addr: str) -> None:
        _ipv6(self.sock, addr)
        self.sock.connect(addr)

    def send(self, frame: bytes, deadline: Optional[float] = None) -> bool:
        self.sock.send(frame)  # queued without limit: never blocks
        return True

    def recv(self, block: bool) -> bytes:
        try:
            frame: bytes = self.sock.recv(0 if block else zmq.NOBLOCK)
        except zmq.Again:
            raise IdleTimeout from None
        return frame

    def trust(self) -> None:
        """Nothing to do: zmq frames are size-limited by the socket."""

    def hub_down_since(self, now: float) -> Optional[float]:
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                break
            if event == zmq.EVENT_CONNECTED:
                self._down_since = None
            elif event == zmq.EVENT_DISCONNECTED and self._down_since is None:
                self._down_since = now
        return self._down_since

    def close(self, linger_ms: int) -> None:
        if not self.sock.closed:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:  # pragma: no cover
                pass
            self.monitor.close(linger=0)
            self.sock.close(linger=linger_ms)
