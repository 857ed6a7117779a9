"""Wire format of ``DistributedContext`` messages: framing and HMAC-SHA256.

Every message is one frame (a ZeroMQ frame on the ``zmq`` transport, a
length-prefixed record on the default stream-socket transport)::

    offset  size  field
    0       2     magic  b"DL"
    2       1     version (1)
    3       1     message type (HELLO ... ABORT below)
    4       4     sender: the sender's global rank
    8       8     seq: the sender's sequence number on this link, strictly increasing
    16      8     op: the collective the message belongs to
    24      n     payload
    24+n    32    HMAC-SHA256 over bytes [0, 24+n)

Why this shape:

- One frame, not a multipart message: a single ``send``/``recv`` per message
  is the cheapest thing either transport does, and there is no frame
  boundary an attacker could shift.
- The MAC is checked with ``hmac.compare_digest`` before *anything* else in
  the frame is trusted; only then is the header unpacked, and only payloads
  of authenticated frames ever reach ``pickle.loads`` (in ``ops``).
- ``seq`` makes replays detectable: a receiver keeps the last ``seq`` seen
  from each sender on each link and drops anything not newer.
- Handshake frames (HELLO, WELCOME) are keyed with the job key; everything
  after them is keyed with a *session* key derived from a fresh random nonce
  of the hub, so frames captured from an earlier job that used the same
  secret are rejected too.

Everything in this module is pure (no sockets), so it can be fuzzed.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import logging
import struct
import time
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional, Union

MAGIC = b"DL"
VERSION = 1
HEADER = struct.Struct("!2sBBIQQ")
HEADER_SIZE = HEADER.size
MAC_SIZE = 32
MIN_FRAME = HEADER_SIZE + MAC_SIZE
NONCE_SIZE = 16

# Message types. Member -> hub: HELLO, READY, AG, GA, NODE_AG, NODE_GA, FAIL.
# Hub -> member: WELCOME, START, RESULT, PART, BCAST, PING, ABORT.
HELLO = 1  # job key: who I am, my nonce
WELCOME = 2  # job key: the hub's nonce, echoing the member's nonce
READY = 3  # session key: proves the member derived this session's key
START = 4  # everyone has arrived; JSON with the node-local hub table
AG = 5  # a pickled contribution to an allgather
GA = 6  # a pickled contribution to a gather
NODE_AG = 7  # hierarchical mode: a bundle of one node's allgather contributions
NODE_GA = 8  # hierarchical mode: a bundle of one node's gather contributions
RESULT = 9  # the pickled list of every contribution (allgather result)
# 10 is unused (a gather acknowledgement in drafts: gather needs no reply).
BCAST = 11  # a pickled broadcast value
PING = 12  # liveness probe; the receiver ignores it
ABORT = 13  # the job's collectives failed; JSON with the reason
FAIL = 14  # member -> hub: this member's collective failed; JSON with the reason
PART = 15  # hub -> member, two ranks: the hub's pickled allgather contribution
MAX_TYPE = PART

TYPE_NAMES = {
    HELLO: "hello",
    WELCOME: "welcome",
    READY: "ready",
    START: "start",
    AG: "allgather",
    GA: "gather",
    NODE_AG: "allgather",
    NODE_GA: "gather",
    RESULT: "allgather",
    BCAST: "broadcast",
    PING: "ping",
    ABORT: "abort",
    FAIL: "failure",
    PART: "allgather",
}

_HANDSHAKE = frozenset((HELLO, WELCOME))
_PREFIX = MAGIC + bytes([VERSION])
_SMALL = 4096
_KDF_LABEL = b"determined_launch/dist/v1"

Secret = Union[str, bytes]
Buffer = Union[bytes, memoryview]


class BadFrame(Exception):
    """A frame that must be dropped; the message says why (for the drop log)."""


class Message(NamedTuple):
    mtype: int
    sender: int
    seq: int
    op: int
    payload: memoryview


class MacKey:
    """An HMAC-SHA256 key with its padded inner and outer hash states
    computed once, so each MAC costs two hash copies instead of a key
    schedule (what ``hmac.HMAC`` does internally; the result is identical
    to ``hmac.digest(key, data, "sha256")``, which the tests check)."""

    __slots__ = ("key", "_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        self.key = key
        block = (hashlib.sha256(key).digest() if len(key) > 64 else key).ljust(64, b"\0")
        # Bound copy methods: every frame sent or received runs mac().
        self._inner = _sha256(block.translate(_IPAD)).copy
        self._outer = _sha256(block.translate(_OPAD)).copy

    def mac(self, data: Buffer) -> bytes:
        inner = self._inner()
        inner.update(data)
        outer = self._outer()
        outer.update(inner.digest())
        return outer.digest()

    def copies(self) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """The inner and outer hash copiers, for a hot path that computes
        ``mac`` inline (``fused``): a call fewer per message, which counts
        when eight processes share two cores."""
        return self._inner, self._outer


def _builtin_sha256() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 where the build has it, else OpenSSL's. Same
    digests; a copy of OpenSSL's allocates and wipes an EVP context, which
    for the ~100-byte frames of a collective cost more than the hashing
    (about 5 % of all CPU in an 8-rank allgather on two cores)."""
    for module in ("_sha2", "_sha256"):  # Python 3.12+, 3.9-3.11
        try:
            return importlib.import_module(module).sha256
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256  # builds without the builtin hashes (FIPS)


_sha256 = _builtin_sha256()


_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


def job_key(secret: Optional[Secret]) -> MacKey:
    """The key for handshake frames, derived from the job secret.

    Deriving (rather than using the secret directly) gives a fixed-size key
    whatever the secret's format. ``None`` (no secret configured) gives a
    well-known key: frames are still checked for integrity, but anyone can
    forge them, which is why ``DistributedContext`` warns and refuses to
    listen beyond loopback in that case.
    """
    material = secret.encode() if isinstance(secret, str) else (secret or b"")
    return MacKey(hmac.digest(material, _KDF_LABEL + b"/job", "sha256"))


def session_key(key: MacKey, hub_nonce: bytes) -> MacKey:
    """The key for every frame after the handshake on one hub's link."""
    return MacKey(hmac.digest(key.key, _KDF_LABEL + b"/session/" + hub_nonce, "sha256"))


def encode(key: MacKey, mtype: int, sender: int, seq: int, op: int, payload: Buffer = b"") -> bytes:
    body = HEADER.pack(MAGIC, VERSION, mtype, sender, seq, op) + payload
    return body + key.mac(body)


def decode(frame: bytes, key: MacKey, skey: Optional[MacKey]) -> Message:
    """Authenticate and parse one frame; raise ``BadFrame`` for anything else.

    ``key`` authenticates handshake frames and ``skey`` (the session key,
    ``None`` before the handshake) everything else. The type byte picks the
    key before the MAC is checked, which is harmless: a forged type only
    selects the key the forgery then fails against.
    """
    n = len(frame)
    if n < MIN_FRAME:
        raise BadFrame(f"short frame ({n} bytes)")
    if frame[:3] != _PREFIX:
        raise BadFrame("not a determined_launch frame")
    mtype = frame[3]
    use = key if mtype in _HANDSHAKE else skey
    if use is None:
        raise BadFrame("frame before handshake")
    # Small frames: slicing bytes is cheaper than going through a memoryview.
    view = memoryview(frame) if n > _SMALL else frame
    if not hmac.compare_digest(use.mac(view[:-MAC_SIZE]), view[-MAC_SIZE:]):
        raise BadFrame("bad MAC")
    if not 1 <= mtype <= MAX_TYPE:
        raise BadFrame(f"unknown message type {mtype}")
    _, _, _, sender, seq, op = HEADER.unpack_from(frame)
    return Message(mtype, sender, seq, op, memoryview(frame)[HEADER_SIZE:-MAC_SIZE])


# --- bundles: several ranks' pickled contributions in one payload -----------
# count u32, then count x (rank u32, length u32), then the bytes back to back.
# Hubs forward contributions as bytes in a bundle instead of unpickling and
# re-pickling them: a hub never needs the objects it only relays.
_COUNT = struct.Struct("!I")


def encode_bundle(parts: Sequence[tuple[int, Buffer]]) -> bytes:
    table: list[int] = []
    for rank, data in parts:
        table += (rank, len(data))
    head = struct.pack(f"!I{len(table)}I", len(parts), *table)
    return head + b"".join(data for _, data in parts)


def decode_bundle(buf: Buffer) -> list[tuple[int, memoryview]]:
    """Split a bundle; raise ``BadFrame`` if its table does not fit its bytes."""
    view = memoryview(buf)
    if len(view) < _COUNT.size:
        raise BadFrame("short bundle")
    (count,) = _COUNT.unpack_from(view)
    table_end = _COUNT.size + 8 * count
    if table_end > len(view):
        raise BadFrame("bundle table exceeds payload")
    table = struct.unpack_from(f"!{2 * count}I", view, _COUNT.size)
    out: list[tuple[int, memoryview]] = []
    pos = table_end
    for i in range(count):
        end = pos + table[2 * i + 1]
        if end > len(view):
            raise BadFrame("bundle entry exceeds payload")
        out.append((table[2 * i], view[pos:end]))
        pos = end
    if pos != len(view):
        raise BadFrame("trailing bytes after bundle")
    return out


class DropLog:
    """Counts dropped frames and logs them at most once per ``interval``.

    A rogue peer can send thousands of frames a second; logging each would
    turn an attack on the port into an attack on the disk.
    """

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.count = 0
        self._logger = logger
        self._interval = interval
        self._last = -interval
        self._unlogged = 0

    def drop(self, reason: str, where: str) -> None:
        self.count += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._logger.warning(
                "DistributedContext dropped %d unauthenticated or invalid frame(s) on %s "
                "(latest: %s); they were not deserialized",
                self._unlogged,
                where,
                reason,
            )
            self._last = now
            self._unlogged = 0
