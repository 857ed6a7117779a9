"""What a different wake-up mechanism would buy: two bare star-allgather prototypes.

    python benchmarks/proto_star_transport.py sock 8 3000
    python benchmarks/proto_star_transport.py efd 8 3000
    EXEC=1 python benchmarks/proto_star_transport.py sock 8 3000   # exec'd members

Not our implementation: no handshake, no replay or failure handling. Each
message does the same Python work as ours (pickle protocol 5, HMAC-SHA256
with precomputed pads, verify before unpickling), over one of two
mechanisms:

- ``sock``: a socketpair per member; the chief polls, members block in
  ``recv`` (the shape of our ``direct`` transport);
- ``efd``: parts and the result in shared memory, wake-ups through one
  ``eventfd`` per member and one for the chief (whose counter gathers the
  members' "part ready" signals, so one read can collect several).

Members are forked (sharing the interpreter's pages) unless ``EXEC=1``.
Prints rank 0's p50 per allgather and the CPU of all processes per
allgather (with ``EXEC=1`` that includes the members' interpreter start).
Results are in RESULTS-distributed.md.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import time
from typing import Any

MODE, N, ITERS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
WARM = 200
SLOT = 4096
HEADER = struct.Struct("!2sBBIQQ")
_BLOCK = (b"k" * 32).ljust(64, b"\0")
_INNER = hashlib.sha256(bytes(b ^ 0x36 for b in _BLOCK))
_OUTER = hashlib.sha256(bytes(b ^ 0x5C for b in _BLOCK))


def mac(data: bytes) -> bytes:
    inner = _INNER.copy()
    inner.update(data)
    outer = _OUTER.copy()
    outer.update(inner.digest())
    return outer.digest()


def encode(mtype: int, sender: int, seq: int, payload: bytes) -> bytes:
    body = HEADER.pack(b"DL", 1, mtype, sender, seq, seq) + payload
    return body + mac(body)


def decode(frame: bytes) -> Any:
    if mac(frame[:-32]) != frame[-32:]:
        raise SystemExit("bad MAC")
    return pickle.loads(frame[HEADER.size : -32])


class Shared:
    """N + 1 slots of shared memory: one part per member, then the result."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR)
        self.mem = mmap.mmap(self.fd, SLOT * (N + 1))

    def put(self, slot: int, frame: bytes) -> None:
        base = slot * SLOT
        self.mem[base : base + 4] = len(frame).to_bytes(4, "big")
        self.mem[base + 4 : base + 4 + len(frame)] = frame

    def get(self, slot: int) -> bytes:
        base = slot * SLOT
        n = int.from_bytes(self.mem[base : base + 4], "big")
        return self.mem[base + 4 : base + 4 + n]


def member(rank: int, fds: dict[str, Any], shared: Shared) -> None:
    sock = socket.socket(fileno=fds["pairs"][rank][1]) if MODE == "sock" else None
    for i in range(WARM + ITERS):
        frame = encode(5, rank, i, pickle.dumps({"rank": rank, "step": i}, 5))
        if sock is None:
            shared.put(rank, frame)
            os.eventfd_write(fds["chief"], 1)
            os.eventfd_read(fds["efd"][rank])
            result = shared.get(N)
        else:
            sock.send(len(frame).to_bytes(4, "big") + frame)
            result = sock.recv(65536)[4:]
        out = decode(result)
        out[rank] = {"rank": rank, "step": i}
    os._exit(0)


def chief(fds: dict[str, Any], shared: Shared) -> list[float]:
    times: list[float] = []
    socks: dict[int, socket.socket] = {}
    if MODE == "sock":
        socks = {r: socket.socket(fileno=fds["pairs"][r][0]) for r in range(1, N)}
    poller = select.poll()
    by_fd = {}
    for r, s in socks.items():
        poller.register(s.fileno(), select.POLLIN)
        by_fd[s.fileno()] = r
    for i in range(WARM + ITERS):
        t0 = time.perf_counter()
        out: list[Any] = [{"rank": 0, "step": i}] + [None] * (N - 1)
        got = 0
        if MODE == "efd":
            while got < N - 1:
                got += os.eventfd_read(fds["chief"])
            for r in range(1, N):
                out[r] = decode(shared.get(r))
            shared.put(N, encode(9, 0, i, pickle.dumps(out, 5)))
            for r in range(1, N):
                os.eventfd_write(fds["efd"][r], 1)
        else:
            while got < N - 1:
                for fd, _ in poller.poll():
                    out[by_fd[fd]] = decode(socks[by_fd[fd]].recv(65536)[4:])
                    got += 1
            frame = encode(9, 0, i, pickle.dumps(out, 5))
            data = len(frame).to_bytes(4, "big") + frame
            for s in socks.values():
                s.send(data)
        if i >= WARM:
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    if len(sys.argv) > 4:  # an exec'd member
        fds = json.loads(sys.argv[4])
        member(int(sys.argv[5]), fds, Shared(fds["shm"]))
    path = f"/dev/shm/proto-star-{os.getpid()}-{os.urandom(4).hex()}"
    with open(path, "wb") as f:
        f.truncate(SLOT * (N + 1))
    shared = Shared(path)
    if MODE == "efd":
        fds: dict[str, Any] = {"chief": os.eventfd(0), "efd": [os.eventfd(0) for _ in range(N)]}
    else:
        pairs = [socket.socketpair() for _ in range(N)]
        fds = {"pairs": [[a.detach(), b.detach()] for a, b in pairs]}
    fds["shm"] = path
    children: list[Any] = []
    for r in range(1, N):
        if os.environ.get("EXEC") == "1":
            keep = [fds["chief"], fds["efd"][r]] if MODE == "efd" else [fds["pairs"][r][1]]
            argv = [sys.executable, __file__, *sys.argv[1:4], json.dumps(fds), str(r)]
            children.append(subprocess.Popen(argv, pass_fds=keep))
        else:
            pid = os.fork()
            if pid == 0:
                member(r, fds, shared)
            children.append(pid)
    c0 = os.times()
    times = sorted(chief(fds, shared))
    for child in children:
        if isinstance(child, subprocess.Popen):
            child.wait()
        else:
            os.waitpid(child, 0)
    c1 = os.times()
    os.unlink(path)
    cpu = sum(c1[k] - c0[k] for k in range(4))
    print(
        f"{MODE} n={N}: p50 {times[len(times) // 2] * 1e6:.0f} us, "
        f"cpu/allgather {cpu / (WARM + ITERS) * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
