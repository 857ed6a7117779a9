"""The hang watchdog (``--hang-timeout``) and the straggler check, over the
ranks' progress files (``core/_progress.py``).

Once a second the node loop calls ``Watchdog.poll``: it reads each rank's
one-line progress file in the job's status directory. A rank that made
progress once and none for ``timeout`` seconds since, while core's context
is open (the file exists) and its work is not finished, may be hung. Then
every rank of this node dumps its Python stacks (faulthandler, on a signal);
the hung one is the rank that is stopped (SIGSTOP, a debugger) or that is not
waiting inside a collective; ranks that only wait in collectives for a rank
elsewhere are judged hung ``WAIT_MARGIN`` seconds later, so the node that
holds the hung rank names it first (the job's first failure). A plain
script never writes the file: it is never judged hung.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import signal
import sys
import time
from collections.abc import Collection, Mapping
from typing import Optional

from determined_launch import envvars
from determined_launch.supervisor.stragglers import RUN as RUN_STEPS
from determined_launch.supervisor.stragglers import Change, StragglerRule

#: Seconds between two reads of the progress files.
PERIOD = 1.0
#: A rank that only waits in a collective is judged this much later.
WAIT_MARGIN = 10.0
#: How long the dumps may take to appear.
DUMP_WAIT = 2.0
_READ_CAP = 256
_STACK_CAP = 64 * 1024
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<fn>\S+)')
#: Where a rank waits for its peers, not for itself (innermost Python frame). DDP all-reduces
#: inside backward() (the autograd engine) and syncs buffers in its forward.
_COLLECTIVE_PATHS = ("torch/distributed/", "torch/autograd/", "torch/nn/parallel/",
                     "determined_launch/core/distributed/", "determined_launch/core/preempt.py",
                     "horovod/", "deepspeed/comm/")
#: Libraries between the program and a collective: a waiting rank's caller is the frame below.
_LIBRARY_PATHS = ("/torch/", "/determined_launch/", "/horovod/", "/deepspeed/")


@dataclasses.dataclass(frozen=True)
class Beat:
    pid: int
    steps: int
    busy: float
    time: float


def parse_beat(text: str) -> Optional[Beat]:
    """The progress line, or None (empty: no progress yet; malformed: ignored)."""
    parts = text.split()
    if len(parts) != 4:
        return None
    try:
        return Beat(int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3]))
    except ValueError:
        return None


def read_beats(status_dir: str) -> dict[int, Beat]:
    prefix, _, suffix = envvars.RANK_PROGRESS_FILE.partition("{rank}")
    out: dict[int, Beat] = {}
    for path in glob.glob(os.path.join(glob.escape(status_dir), prefix + "*" + suffix)):
        middle = os.path.basename(path)[len(prefix):-len(suffix)]
        if not middle.isdigit():
            continue
        try:
            with open(path, "rb") as f:
                beat = parse_beat(f.read(_READ_CAP).decode("ascii", "replace"))
        except OSError:
            continue
        if beat is not None:
            out[int(middle)] = beat
    return out


def overdue(beats: Mapping[int, Beat], now: float, timeout: float,
            done: Collection[int] = ()) -> list[int]:
    """Ranks silent for ``timeout`` seconds or more (pure)."""
    return sorted(r for r, b in beats.items() if r not in done and now - b.time >= timeout)


Frame = tuple[str, int, str]  # file, line, function


def frames(stack: str) -> list[Frame]:
    """The main thread's frames in one faulthandler dump, innermost first (the
    main thread is the dump's last block)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack.strip())
    out = []
    for line in blocks[-1].splitlines():
        m = _FRAME.match(line)
        if m:
            out.append((m["file"], int(m["line"]), m["fn"]))
    return out


def innermost(stack: str) -> Optional[Frame]:
    found = frames(stack)
    return found[0] if found else None


def where(stack: str) -> str:
    """Where a rank waits: its innermost frame, and the program's own frame
    that called into the collective ("in allgather (context.py:88) from total
    (train.py:40)")."""
    found = frames(stack)
    if not found:
        return "somewhere: no Python stack came back"
    text = describe_frame(found[0])
    if waiting(found[0]):
        caller = next((f for f in found if not any(p in f[0] for p in _LIBRARY_PATHS)),
                      next((f for f in found if not waiting(f)), None))
        if caller is not None:
            text += f" from {caller[2]} ({os.path.basename(caller[0])}:{caller[1]})"
    return text


def waiting(frame: Optional[Frame]) -> bool:
    return frame is not None and any(p in frame[0] for p in _COLLECTIVE_PATHS)


def describe_frame(frame: Optional[Frame]) -> str:
    if frame is None:
        return "no Python stack came back"
    return f"in {frame[2]} ({os.path.basename(frame[0])}:{frame[1]})"


def state(pid: int) -> str:
    """The process's state letter (``/proc/PID/stat``); "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read(512).rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def stopped(pid: int) -> bool:
    """Stopped (state T or t: SIGSTOP, a debugger)."""
    return state(pid) in ("T", "t")


def alive(pid: int) -> bool:
    """Neither gone nor a zombie: a rank that exited is the verdict's, not the watchdog's."""
    return state(pid) not in ("", "Z", "X")


@dataclasses.dataclass(frozen=True)
class Hang:
    rank: int
    silent: float  # seconds without progress
    lines: tuple[str, ...]  # what to print: the stacks and where the others wait


def choose(silent: Mapping[int, float], stops: Collection[int],
           frames: Mapping[int, Optional[Frame]], timeout: float
           ) -> Optional[int]:
    """The hung rank among those ``silent`` (seconds) past ``timeout`` (pure):
    a stopped one, else one whose stack shows it is not waiting in a collective,
    else one whose stack did not come back, else (past the wait margin) the
    longest silent; None: not yet."""
    for pool in (sorted(r for r in silent if r in stops),
                 sorted(r for r in silent if frames.get(r) and not waiting(frames.get(r))),
                 sorted(r for r in silent if not frames.get(r))):
        if pool:
            return max(pool, key=lambda r: silent[r])
    late = [r for r, s in silent.items() if s >= timeout + WAIT_MARGIN]
    return max(late, key=lambda r: silent[r]) if late else None


class Watchdog:
    def __init__(self, status_dir: str, timeout: Optional[float]) -> None:
        self.status_dir, self.timeout = status_dir, timeout
        self.next_at = 0.0
        self.rule = StragglerRule()
        self._prev: dict[int, Beat] = {}
        self._stack_seen: dict[int, int] = {}

    def poll(self, now: float, wall: float, done: Collection[int]
             ) -> tuple[Optional[Hang], list[Change]]:
        """At most once a ``PERIOD``: a hung rank (or None) and straggler changes."""
        if now < self.next_at:
            return None, []
        self.next_at = now + PERIOD
        beats = {r: b for r, b in read_beats(self.status_dir).items()
                 if r not in done and alive(b.pid)}
        changes = self.rule.window(self._window(beats))
        if not self.timeout:
            return None, changes
        # A rank rewrites its line at most once a PERIOD: its last progress may be that much
        # newer than the line says, so its silence is at least the line's age less PERIOD.
        late = overdue(beats, wall, self.timeout + envvars.PROGRESS_PERIOD, done)
        if not late:
            return None, changes
        return self._judge(beats, late, wall), changes

    def check(self, done: Collection[int], node: int, host: str, run_dir: Optional[str]
              ) -> Optional[Hang]:
        """``poll`` now, saying what it found on stderr (and stragglers in ``run_dir``)."""
        wall = time.time()
        hang, changes = self.poll(time.monotonic(), wall, done)
        lines = []
        for change in changes:
            lines.append(straggler_line(change, node, host))
            record_straggler(run_dir, change, node, host, wall)
        if hang is not None:
            lines += [f"rank {hang.rank} on node {node} ({host}) hung: no progress for "
                      f"{hang.silent:.0f} s", *hang.lines]
        if lines:  # stacks name the program's files: nothing unprintable reaches the terminal
            text = "\n".join("det-launch: " + "".join(c if c.isprintable() else "?" for c in line)
                             for line in lines)
            print(text, file=sys.stderr, flush=True)
        return hang

    def _window(self, beats: Mapping[int, Beat]) -> dict[int, tuple[int, float]]:
        out: dict[int, tuple[int, float]] = {}
        for rank, b in beats.items():
            p = self._prev.get(rank)
            if p is not None and p.pid == b.pid and b.steps > p.steps:
                out[rank] = (b.steps - p.steps, (b.busy - p.busy) / (b.steps - p.steps))
            elif p is not None and p.pid == b.pid:
                out[rank] = (0, 0.0)
        self._prev = dict(beats)
        return out

    def _judge(self, beats: Mapping[int, Beat], late: list[int], wall: float) -> Optional[Hang]:
        silent = {r: wall - beats[r].time - envvars.PROGRESS_PERIOD for r in late}
        stops = {r for r in late if stopped(beats[r].pid)}
        stacks = self._dump({r: b for r, b in beats.items() if r not in stops})
        rank = choose(silent, stops, {r: innermost(s) for r, s in stacks.items()},
                      self.timeout or 0.0)
        if rank is None:
            return None
        lines = []
        if rank in stops:
            lines.append(f"rank {rank} is stopped (SIGSTOP or a debugger): no Python stack")
        elif stacks.get(rank):
            lines.append(f"rank {rank}'s Python stack (most recent call first):")
            lines.extend("  " + line for line in stacks[rank].strip().splitlines())
        for other in sorted(beats):  # the node's other ranks, where each waits
            if other != rank:
                state = "is stopped" if other in stops else f"waits {where(stacks.get(other, ''))}"
                lines.append(f"rank {other} {state}")
        return Hang(rank, silent[rank], tuple(lines))

    def _dump(self, beats: Mapping[int, Beat]) -> dict[int, str]:
        """Each rank's new faulthandler dump (a stopped process would answer only once
        continued: not asked)."""
        sig = int(signal.SIGRTMIN) + envvars.PROGRESS_STACK_OFFSET
        asked = []
        for rank, b in beats.items():
            try:
                os.kill(b.pid, sig)
                asked.append(rank)
            except OSError:
                pass
        # faulthandler writes a dump in many small writes (one thread block after another, the
        # main thread's last): a dump is taken once it is whole and unchanged 50 ms later.
        out: dict[int, str] = {}
        last: dict[int, str] = {}
        deadline = time.monotonic() + DUMP_WAIT
        while True:
            for rank in asked:
                text = self._read_stack(rank)
                if text and _complete(text) and last.get(rank) == text:
                    out[rank] = text
                last[rank] = text
            if len(out) == len(asked) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for rank in out:
            self._stack_seen[rank] = self._stack_seen.get(rank, 0) + len(out[rank].encode())
        return out

    def _read_stack(self, rank: int) -> str:
        path = os.path.join(self.status_dir, envvars.RANK_STACK_FILE.format(rank=rank))
        try:
            with open(path, "rb") as f:
                f.seek(self._stack_seen.get(rank, 0))
                return f.read(_STACK_CAP).decode("utf-8", "replace")
        except OSError:
            return ""


def _complete(text: str) -> bool:
    """A dump is whole once its main thread's block (the last) has a frame
    and ends with a newline (faulthandler writes it last)."""
    return text.endswith("\n") and innermost(text) is not None


#: The run directory's stream of straggler changes (JSON lines).
STRAGGLERS_STREAM = "stragglers.jsonl"


def straggler_line(c: Change, node: int, host: str) -> str:
    who = f"rank {c.rank} on node {node} ({host})"
    if c.slow:
        return (f"{who} is a straggler: its steps take {c.step_time:.3g} s, "
                f"{c.step_time / c.median:.1f}x its peers' median {c.median:.3g} s, "
                f"for {RUN_STEPS} steps in a row")
    return (f"{who} is no longer a straggler: its steps take {c.step_time:.3g} s "
            f"(its peers' median {c.median:.3g} s)")


def record_straggler(run_dir: Optional[str], c: Change, node: int, host: str, wall: float) -> None:
    """One JSON line in ``<run_dir>/stragglers.jsonl`` (for det-launch ui and the
    experiment table); a run directory that cannot be written only loses the record."""
    if not run_dir:
        return
    line = json.dumps({"time": wall, "rank": c.rank, "node": node, "host": host,
                       "straggler": c.slow, "step_time": c.step_time, "median": c.median})
    try:
        fd = os.open(os.path.join(run_dir, STRAGGLERS_STREAM),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, line.encode() + b"\n")
        finally:
            os.close(fd)
    except OSError:
        pass
