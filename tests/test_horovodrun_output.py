"""horovodrun's output streams (``determined_launch.nodeexec.horovodrun``):
its forwarding threads, one per worker stream, each write one line per call
to the same stdout. Runs without Horovod."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TextIO

from determined_launch.nodeexec.horovodrun import LockedLines

THREADS, LINES = 4, 300


def _line(t: int, i: int) -> str:
    # every 10th line longer than a pipe's atomic write, as in tests/_burst.py
    return f"[{t}]<stdout>:[rank={t}] L{i} " + "x" * (20_000 + i if i % 10 == 9 else i)


def _forward(make: Callable[[int], TextIO]) -> list[bytes]:
    """THREADS threads writing as horovodrun's ``prefix_connection`` does
    (``write(line); flush()``), plus ``print`` from the main thread; the
    pipe's bytes, split into lines."""
    r, w = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(r, 1000), b"")))
    reader.start()
    stream = make(w)

    def forward(t: int) -> None:
        for i in range(LINES):
            stream.write(_line(t, i) + "\n")
            stream.flush()

    threads = [threading.Thread(target=forward, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for i in range(LINES):
        print("Process", i, "exit with status code 0.", file=stream)  # write()s its parts
    for thread in threads:
        thread.join()
    stream.flush()
    os.close(w)
    reader.join()
    os.close(r)
    return b"".join(chunks).split(b"\n")


def test_forwarding_threads_write_whole_lines() -> None:
    """Every thread's lines whole and in order, ``print``'s parts joined.
    horovodrun's own stdout under PYTHONUNBUFFERED (``TextIOWrapper(FileIO,
    write_through=True)``) fails this: every thread's lines spliced, 3 runs of 3."""
    lines = _forward(LockedLines)
    assert lines.pop() == b""
    for t in range(THREADS):
        mine = [line for line in lines if line.startswith(b"[%d]<stdout>:" % t)]
        assert mine == [_line(t, i).encode() for i in range(LINES)]
    ours = [line for line in lines if line.startswith(b"Process ")]
    assert ours == [b"Process %d exit with status code 0." % i for i in range(LINES)]
    assert len(lines) == (THREADS + 1) * LINES


def test_the_stream_answers_what_horovodrun_asks() -> None:
    r, w = os.pipe()
    try:
        stream = LockedLines(w)
        assert stream.fileno() == w and stream.writable() and not stream.isatty()
        assert stream.encoding == "utf-8"
        assert stream.write("héllo \udcff\n") == 8  # encodable or not, never raises
        assert os.read(r, 100) == "héllo \\udcff\n".encode()
    finally:
        os.close(r)
        os.close(w)

