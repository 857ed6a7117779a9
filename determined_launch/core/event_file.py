"""TensorBoard event files of scalars, written with the standard library alone.

Why not the ``tensorboard`` package's writer: importing it pulls in numpy, its
TensorFlow stub and, where installed, boto3 and fsspec: 0.7-1.4 s of CPU in
every process that reports a metric (each trial of a search pays it). The
format is small and stable, so core writes it itself:

- a file is a sequence of TFRecords: ``uint64 length``, ``uint32 masked
  CRC-32C of the length``, the bytes, ``uint32 masked CRC-32C of the bytes``
  (little-endian);
- each record is a serialized ``tensorboard.Event`` protocol buffer: the first
  one names the format (``file_version: "brain.Event:2"``), each later one has
  ``wall_time``, ``step`` and a ``Summary`` of ``(tag, simple_value)`` values.

TensorBoard reads these files as its own (tested with its reader).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import BinaryIO, Optional

_CASTAGNOLI = 0x82F63B78


def _crc_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CASTAGNOLI if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord framing uses it."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> bytes:
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def record(data: bytes) -> bytes:
    """One TFRecord holding ``data``."""
    length = struct.pack("<Q", len(data))
    return length + _masked(crc32c(length)) + data + _masked(crc32c(data))


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64s as protobuf writes them: ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (strings, messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, *, step: int = 0, file_version: Optional[str] = None,
          scalars: tuple[tuple[str, float], ...] = ()) -> bytes:
    """A serialized ``Event``: field 1 wall_time (double), 2 step (int64),
    3 file_version (string), 5 summary (``Summary``: repeated field 1 ``Value``
    with 1 tag (string) and 2 simple_value (float))."""
    out = b"\x09" + struct.pack("<d", wall_time) if wall_time else b""  # proto3 omits defaults
    if step:
        out += b"\x10" + _varint(step)
    if file_version is not None:
        out += _field(3, file_version.encode())
    if scalars:
        values = b"".join(_field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
                          for tag, value in scalars)
        out += _field(5, values)
    return out


class EventFileWriter:
    """Scalars into a new event file in ``logdir`` (the ``add_scalar`` /
    ``flush`` / ``close`` subset of TensorBoard's writers)."""

    def __init__(self, logdir: str) -> None:
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.0"
        self.path = os.path.join(logdir, name)
        self._file: Optional[BinaryIO] = open(self.path, "ab")  # noqa: SIM115 (kept open)
        self._file.write(record(event(now, file_version="brain.Event:2")))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self._file is None:
            raise ValueError(f"{self.path}: the event file is closed")
        self._file.write(record(event(time.time(), step=step, scalars=((tag, value),))))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
