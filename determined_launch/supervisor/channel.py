"""The control channel's wire: HMAC-checked JSON lines over one socket.

Wire format: one JSON object per line, each line prefixed by the hex
HMAC-SHA256 of ``nonce|direction|seq|json`` under the job secret. The nonce
is fresh per connection (sent by the chief first), and ``seq`` counts lines
per direction, so a recorded line cannot be replayed on another connection
or out of order. A line that fails the check closes the connection; JSON is
parsed only after the check, and nothing is ever unpickled.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from typing import Optional

from determined_launch.supervisor.events import Message

logger = logging.getLogger("determined_launch.control")

#: Seconds between two log lines about dropped lines; the rest are counted.
_DROP_LOG_PERIOD = 10.0
_MAX_LINE = 64 * 1024


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
            logger.warning("control channel: over-long line from peer; closing connection")
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
