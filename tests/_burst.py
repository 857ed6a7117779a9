"""Ranks writing lines as fast as they can, and the check that every line
arrived whole, labelled with its own rank, exactly once and in order
(issue 24: the load test of wrap_rank and the launchers' relay)."""

from __future__ import annotations

import random
import re
from pathlib import Path

#: A worker: ``python burst.py [RANK] N`` writes ``expected(RANK, N)`` as
#: fast as it can (RANK defaults to $RANK, or horovodrun's $HOROVOD_RANK).
#: Needs the repository on PYTHONPATH, as the tests' environments have it.
BURST = """
import os, sys
from tests._burst import expected
args = sys.argv[1:]
rank = int(args.pop(0) if len(args) > 1 else os.environ.get("RANK") or os.environ["HOROVOD_RANK"])
view = memoryview(b"".join(line + b"\\n" for line in expected(rank, int(args[0]))))
while view:
    view = view[os.write(1, view[: 1 << 20]):]
"""


def write_burst(directory: Path) -> Path:
    path = directory / "burst.py"
    path.write_text(BURST)
    return path


def expected(rank: int, n: int) -> list[bytes]:
    """Rank ``rank``'s lines without their newlines: most 0-300 bytes, every
    50th 4-60 KiB (longer than a pipe's atomic write, within wrap_rank's
    64 KiB cap)."""
    rnd = random.Random(rank)

    def size(i: int) -> int:
        return rnd.randrange(4096, 61440) if i % 50 == 49 else rnd.randrange(0, 301)

    return [b"R%d L%d %s" % (rank, i, b"x" * size(i)) for i in range(n)]


#: wrap_rank's label, after horovodrun's own ``[N]<stdout>:`` (which must agree).
_LABEL = re.compile(rb"(?:\[(\d+)\]<stdout>:)?\[rank=(\d+)\] ")


def problems(out: bytes, ranks: int, n: int) -> list[str]:
    """Empty when ``out`` holds each rank's lines whole, labelled with that
    rank, exactly once and in order (other ranks' lines between them)."""
    got: dict[int, list[bytes]] = {r: [] for r in range(ranks)}
    bad = []
    for line in out.split(b"\n")[:-1]:
        m = _LABEL.match(line)
        if m is None or int(m.group(2)) not in got or m.group(1) not in (None, m.group(2)):
            bad.append(line)
        else:
            got[int(m.group(2))].append(line[m.end():])
    found = [f"{len(bad)} unlabelled lines, first {bad[0][:80]!r}"] if bad else []
    for rank, lines in got.items():
        want = expected(rank, n)
        if lines != want:
            mine = set(want)
            wrong = sum(1 for line in lines if line not in mine)
            found.append(f"rank {rank}: {len(lines)} lines of {n}, {wrong} not its own")
    if not out.endswith(b"\n"):
        found.append("output does not end with a newline")
    return found
