"""Opening the control channel's sockets (``control.py``): the chief's listening
socket, and a node's connection, proven by the job's key, to the chief.

Both ends agree on a session key from their two nonces (``channel.py``); the
first authenticated lines prove the peer holds the job secret.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Optional

from determined_launch.errors import LaunchError
from determined_launch.supervisor.channel import (
    AuthenticatedStream,
    new_nonce,
    read_nonce,
    session_key,
)
from determined_launch.supervisor.events import Kind, Message, message
from determined_launch.supervisor.portinfo import port_holder


class ControlError(LaunchError):
    """The control channel could not be set up or was used wrongly."""


def read_first(stream: AuthenticatedStream, deadline: float) -> Optional[list[Message]]:
    """The first authenticated lines (those that came with it too), by ``deadline``."""
    while (left := deadline - time.monotonic()) > 0:
        stream.sock.settimeout(left)
        msgs = stream.recv_lines()
        if msgs is None:
            return None
        if msgs:
            return msgs
    return None


def listen(host: str, port: int, peer: str) -> socket.socket:
    """Bind the chief's address if it is local, else every interface.

    Container addresses are often the host's (NAT), which cannot be bound
    inside the container; traffic is authenticated either way.
    """
    last_error: Optional[OSError] = None
    for candidate in (host, ""):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((candidate, port))
            sock.listen(64)
            return sock
        except OSError as e:
            sock.close()
            last_error = e
            if e.errno == 98:  # EADDRINUSE: binding elsewhere won't help
                break
    held = port_holder(port) if isinstance(last_error, OSError) and last_error.errno == 98 else None
    by = f" (held by {held})" if held else ""
    raise ControlError(
        f"cannot listen on {host}:{port} for the {peer}s' control channel: {last_error}{by}; "
        "the launcher uses C10D_PORT and the next two (each later generation its own three) - "
        "set C10D_PORT to move them"
    )


def connect(host: str, port: int, *, key: bytes, job: str, node_rank: int, peer: str,
            timeout: float, handshake_timeout: float
            ) -> tuple[AuthenticatedStream, list[Message]]:
    """A connection whose peer proved the job's ``key`` for this connection's
    nonces; a peer that does not (another job, a replay of an earlier
    connection) is hung up on, and the chief tried again until ``timeout``.
    Also returns the first lines that came with the proof."""
    start = time.monotonic()
    deadline = start + timeout
    notices = iter(notice_times(timeout))
    next_notice = next(notices, None)
    last_error: Optional[Exception] = None
    while time.monotonic() < deadline:
        waited = time.monotonic() - start
        if next_notice is not None and waited >= next_notice:
            # Without this a node whose chief never comes is silent for the whole
            # connect timeout (300 s by default): say who it waits for and why.
            print(f"det-launch: node {node_rank} is still waiting for the chief's {peer} at "
                  f"{host}:{port} ({waited:.0f}s of {timeout:.0f}s; last: {last_error})",
                  file=sys.stderr, flush=True)
            next_notice = next(notices, None)
        try:
            sock = socket.create_connection((host, port), timeout=2.0)
        except OSError as e:
            last_error = e
            time.sleep(0.2)
            continue
        try:  # one deadline for the whole handshake, as on the chief's side
            until = time.monotonic() + min(handshake_timeout, max(deadline - time.monotonic(), 0.5))
            sock.settimeout(until - time.monotonic())
            theirs = read_nonce(sock, until)
            if theirs is None:
                raise ConnectionError("the peer sent no nonce")
            mine = new_nonce()
            sock.sendall(f"{mine}\n".encode())
            stream = AuthenticatedStream(sock, session_key(key, job, theirs, mine),
                                         f"{theirs}.{mine}", is_chief=False)
            stream.send(message(Kind.HELLO, node=node_rank))
            first = read_first(stream, until)
            if first is not None:
                return stream, first
            last_error = _Unproven("it answered but never proved the job secret: is "
                                   "DET_DIST_SECRET / job_secret the same on every node?")
        except (OSError, UnicodeDecodeError) as e:
            last_error = e
        sock.close()
        time.sleep(0.2)
    hint = "" if isinstance(last_error, _Unproven) else f"; is the {peer} running on node 0?"
    raise ControlError(
        f"could not reach the chief's {peer} at {host}:{port} within {timeout:.0f}s "
        f"({last_error}){hint}"
    )


def notice_times(timeout: float) -> list[float]:
    """Seconds into a wait for the chief at which a node says it is still waiting:
    after 10 s and 30 s, then every minute, never at or after the timeout itself
    (the error says it then)."""
    times: list[float] = []
    at = 10.0
    while at < timeout:
        times.append(at)
        at = 30.0 if at < 30.0 else at + 60.0
    return times


class _Unproven(ConnectionError):
    """The peer at the chief's address does not hold this job's key."""
