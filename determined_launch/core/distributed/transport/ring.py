"""A single-producer, single-consumer byte ring in shared memory (for ``shm``).

One ring carries one direction of one link: the same length-prefixed
``wire`` frames a stream socket would (``stream.framed``), so a frame of
any size fits: what does not fit now is written as the reader frees room.
Nothing here makes a system call; the channels in ``shm`` add the
wake-ups. Works on any writable buffer, so the tests drive it with a
``bytearray``.

Layout of one ring (``size(capacity)`` bytes)::

    offset 0    u64  write position   (written by the writer only)
    offset 8    u64  writer waiting   (the writer is blocked for room)
    offset 64   u64  read position    (written by the reader only)
    offset 128  capacity bytes of data

Positions count bytes since the start and only grow; ``pos % capacity``
is where they point. Each word has one writer, so no atomic instruction is
needed, only that another process sees one process's stores in the order
made: true of x86-64 (total store order), which is why ``shm`` is used
only there. The data is written before the write position that publishes
it, and read before the read position that frees it. The position words
sit on separate cache lines, so writer and reader don't contend for one.
"""

from __future__ import annotations

from typing import Optional

from determined_launch.core.distributed.transport.stream import LEN_SIZE, split_frames

HEADER = 128
#: Indexes of the positions in ``Ring.words``, the header as u64 words.
WRITE, READ = 0, 8
_WRITE, _WAITING, _READ = WRITE, 1, READ


def size(capacity: int) -> int:
    """Bytes of shared memory one ring of ``capacity`` data bytes needs."""
    return HEADER + capacity


class Ring:
    """One end of a ring: ``put`` for the writer, ``frames`` for the reader."""

    __slots__ = ("_words", "_data", "_cap", "_buf", "_pending", "words")

    def __init__(self, mem: memoryview, capacity: int) -> None:
        if capacity & (capacity - 1) or capacity < 2 * LEN_SIZE:
            raise ValueError(f"ring capacity {capacity} is not a power of two >= 16")
        self._words = mem[:HEADER].cast("Q")
        #: The header, read-only to callers: ``words[WRITE] == words[READ]``
        #: is how a hot loop checks for new bytes without a call.
        self.words = self._words
        self._data = mem[HEADER : HEADER + capacity]
        self._cap = capacity
        #: Reader: bytes of a frame that arrived in pieces.
        self._buf = bytearray()
        #: Writer: what is still to be written of the frame(s) being sent.
        self._pending: list[memoryview] = []

    # ------------------------------------------------------------ writer
    def put(self, chunks: tuple[memoryview, ...] = ()) -> bool:
        """Queue ``chunks`` after anything pending and write what fits now;
        True when nothing is left pending. The caller wakes the reader."""
        pending = self._pending
        pending.extend(chunks)
        words = self._words
        pos = words[_WRITE]
        free = self._cap - (pos - words[_READ])
        while pending and free:
            chunk = pending[0]
            n = min(free, len(chunk))
            self._copy_in(pos, chunk[:n])
            pos += n
            free -= n
            if n == len(chunk):
                pending.pop(0)
            else:
                pending[0] = chunk[n:]
        words[_WRITE] = pos  # publish: the bytes above are complete
        words[_WAITING] = 1 if pending else 0
        return not pending

    def put_frame(self, frame: bytes) -> bool:
        """``put(stream.framed(frame))``, without building the prefixed copy
        when the frame fits in one piece: the usual case, on the hot path."""
        words = self._words
        pos = words[_WRITE]
        off = pos % self._cap
        end = off + LEN_SIZE + len(frame)
        if self._pending or end > self._cap or pos + end - off - words[_READ] > self._cap:
            return self.put((memoryview(len(frame).to_bytes(LEN_SIZE, "big")), memoryview(frame)))
        data = self._data
        data[off : off + LEN_SIZE] = len(frame).to_bytes(LEN_SIZE, "big")
        data[off + LEN_SIZE : end] = frame
        words[_WRITE] = pos + end - off
        return True

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def _copy_in(self, pos: int, chunk: memoryview) -> None:
        off = pos % self._cap
        first = min(len(chunk), self._cap - off)
        self._data[off : off + first] = chunk[:first]
        if first < len(chunk):
            self._data[: len(chunk) - first] = chunk[first:]

    # ------------------------------------------------------------ reader
    def frames(self) -> Optional[list[bytes]]:
        """Every frame completed so far (None for a length no reader could
        hold: the writer is broken). Whether the writer waits for the room
        just freed is ``writer_waiting``."""
        words = self._words
        pos = words[_READ]
        avail = words[_WRITE] - pos
        if not avail:
            return []
        off = pos % self._cap
        if not self._buf and avail >= LEN_SIZE and off + LEN_SIZE <= self._cap:
            # Fast path: one whole frame, not wrapped, nothing half read.
            n = int.from_bytes(self._data[off : off + LEN_SIZE], "big")
            end = off + LEN_SIZE + n
            if avail == LEN_SIZE + n and end <= self._cap:
                frame = bytes(self._data[off + LEN_SIZE : end])
                words[_READ] = pos + avail  # free the room after copying out
                return [frame]
        first = min(avail, self._cap - off)
        self._buf += self._data[off : off + first]
        if first < avail:
            self._buf += self._data[: avail - first]
        words[_READ] = pos + avail
        return split_frames(self._buf, 1 << 62)

    @property
    def writer_waiting(self) -> bool:
        return bool(self._words[_WAITING])

    def release(self) -> None:
        """Drop the views into shared memory, so its mapping can be closed."""
        self._words.release()
        self._data.release()
