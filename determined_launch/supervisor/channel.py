"""The control channel's wire: HMAC-checked JSON lines over one socket.

Handshake, then lines::

    chief -> node   chief nonce (32 hex digits, plain)
    node -> chief   node nonce (32 hex digits, plain)
    both            session key = HMAC(job key, job identity | chief nonce | node nonce)
    chief -> node   first authenticated line (a heartbeat): the node trusts
                    the connection only after it
    node -> chief   HELLO, authenticated

Each line is prefixed by the hex HMAC-SHA256 of ``nonces|direction|seq|json``
under the session key; ``seq`` counts lines per direction. Both ends add a
fresh nonce, so a recording of either direction is useless on any other
connection: a fake chief replaying an earlier connection's lines cannot
produce lines for the node's new nonce, and a replayed node cannot for the
chief's. The job identity (control port, number of nodes) in the key keeps
differently shaped jobs that share a secret apart. A line that fails the check closes the
connection; JSON is parsed only after the check, and nothing is ever
unpickled.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import secrets
import socket
import string
import threading
import time
from typing import Optional

from determined_launch.supervisor.events import Message

logger = logging.getLogger("determined_launch.control")

#: Seconds between two log lines about dropped lines; the rest are counted.
_DROP_LOG_PERIOD = 10.0
_MAX_LINE = 64 * 1024
_NONCE_BYTES = 16


class AuthenticatedStream:
    """A socket carrying HMAC-checked JSON lines in both directions."""

    def __init__(self, sock: socket.socket, key: bytes, nonce: str, is_chief: bool) -> None:
        self.sock = sock
        self.key = key
        self.nonce = nonce
        self.send_dir, self.recv_dir = ("c2n", "n2c") if is_chief else ("n2c", "c2n")
        self.send_seq = 0
        self.recv_seq = 0
        self.buffer = b""
        self.send_lock = threading.Lock()

    def _mac(self, direction: str, seq: int, payload: str) -> str:
        msg = f"{self.nonce}|{direction}|{seq}|{payload}".encode()
        return hmac.new(self.key, msg, hashlib.sha256).hexdigest()

    def send(self, message: Message) -> None:
        payload = json.dumps(message, separators=(",", ":"))
        with self.send_lock:
            line = f"{self._mac(self.send_dir, self.send_seq, payload)} {payload}\n"
            self.send_seq += 1
            self.sock.sendall(line.encode())

    def recv_lines(self) -> Optional[list[Message]]:
        """Read what is available; ``None`` on EOF or a bad line."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return []
        except OSError:
            return None
        if not data:
            return None
        self.buffer += data
        out: list[Message] = []
        while b"\n" in self.buffer:
            raw, self.buffer = self.buffer.split(b"\n", 1)
            msg = self._verify(raw)
            if msg is None:
                return None
            out.append(msg)
        if len(self.buffer) > _MAX_LINE:
            _DROPS.note("over-long")  # rate-limited like every other reject
            return None
        return out

    def _verify(self, raw: bytes) -> Optional[Message]:
        try:
            mac, payload = raw.decode("ascii", errors="strict").split(" ", 1)
        except (UnicodeDecodeError, ValueError):
            _DROPS.note("malformed")
            return None
        expected = self._mac(self.recv_dir, self.recv_seq, payload)
        if not hmac.compare_digest(mac, expected):
            _DROPS.note("unauthenticated")
            return None
        self.recv_seq += 1
        try:
            msg = json.loads(payload)
        except json.JSONDecodeError:
            return None
        return msg if isinstance(msg, dict) else None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _DropLog:
    """Logs dropped lines at most once per ``_DROP_LOG_PERIOD``, with a count,
    so a port scanner or a fuzzer cannot flood the job's log."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.last = -_DROP_LOG_PERIOD

    def note(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1
            now = time.monotonic()
            if now - self.last < _DROP_LOG_PERIOD:
                return
            self.last = now
            what = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
            self.counts.clear()
        logger.warning("control channel: dropped lines (%s); each closed its connection", what)


_DROPS = _DropLog()


def derive_key(secret: str) -> bytes:
    return hashlib.sha256(b"determined_launch control\0" + secret.encode()).digest()


def new_nonce() -> str:
    return secrets.token_hex(_NONCE_BYTES)


def session_key(key: bytes, job: str, chief_nonce: str, node_nonce: str) -> bytes:
    """The key of one connection: both ends' fresh nonces and the job's identity."""
    return hmac.new(key, f"session|{job}|{chief_nonce}|{node_nonce}".encode(),
                    hashlib.sha256).digest()


def read_nonce(sock: socket.socket, deadline: Optional[float] = None) -> Optional[str]:
    """The peer's plain nonce line, byte by byte (what follows is the stream's);
    ``None`` unless it is exactly a nonce. ``deadline`` (``time.monotonic``)
    bounds the whole line, not each byte: ``socket.timeout`` once it passes."""
    raw = b""
    while not raw.endswith(b"\n"):
        if len(raw) > 2 * _NONCE_BYTES:
            return None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the handshake's deadline passed")
            sock.settimeout(left)
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        raw += chunk
    text = raw[:-1].decode("ascii", errors="replace")
    if len(text) != 2 * _NONCE_BYTES or text.strip(string.hexdigits):
        return None
    return text
