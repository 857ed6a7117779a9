"""What the link protocol (``links``) needs from a transport.

Two transports implement it: ``direct`` (stdlib sockets, the default:
one thread hop per message) and ``zeromq`` (ZeroMQ ROUTER/DEALER). Both
carry the same frames (``wire``); a channel moves opaque frames and knows
which peer connections are alive, nothing more, so authentication, replay
protection and failure policy live in one place.
"""

from __future__ import annotations

from typing import Optional, Protocol

#: How often a blocked wait wakes up to check liveness and deadlines.
SLICE_MS = 250
#: Normal close of a ZeroMQ socket: how long undelivered frames may hold up
#: interpreter exit. Bounded, so exit never hangs, yet a result sent just
#: before ``close()`` still reaches live peers. (Direct sends complete
#: before they return, so they have nothing to linger for.)
LINGER_MS = 1000
#: Transports by name; "direct" is the default (see direct.py for why).
TRANSPORTS = ("direct", "zmq")


class IdleTimeout(Exception):
    """``recv`` found nothing within one slice (or at once, when not blocking)."""


class BindError(Exception):
    def __init__(self, in_use: bool, detail: str) -> None:
        super().__init__(detail)
        self.in_use = in_use


class HubChannel(Protocol):
    #: Seconds a peer may stay unreachable before it counts as dead
    #: (0 when a lost connection is final).
    grace: float

    def bind(self, addr: str) -> str: ...

    def recv(self, block: bool) -> Optional[tuple[bytes, bytes]]:
        """(peer id, frame), or None for a frame the channel dropped.
        Raises IdleTimeout."""

    def send(self, peer: bytes, frame: bytes) -> bool:
        """False when the peer's connection is gone."""

    def send_many(
        self, peers: list[bytes], frame: bytes, deadline: Optional[float] = None
    ) -> list[bytes]:
        """Send to each; return the peers whose connection is gone (or that
        did not take the frame before ``deadline``, a ``time.monotonic()``)."""

    def reachable(self, peer: bytes, ping: bytes) -> bool: ...

    def trust(self, peer: bytes) -> None:
        """The peer authenticated: lift pre-authentication limits."""

    def close(self, linger_ms: int) -> None: ...


class MemberChannel(Protocol):
    grace: float

    def connect(self, addr: str) -> None: ...

    def send(self, frame: bytes, deadline: Optional[float] = None) -> bool:
        """False when the frame could not be sent before ``deadline``."""

    def recv(self, block: bool) -> bytes:
        """The next frame from the hub. Raises IdleTimeout."""

    def hub_down_since(self, now: float) -> Optional[float]: ...

    def trust(self) -> None: ...

    def close(self, linger_ms: int) -> None: ...
