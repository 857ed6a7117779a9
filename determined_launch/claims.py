"""Generation claims: two groups of survivors never both continue one job.

When nodes lose sight of each other (a partition, a chief that is only
silent), each group may decide that the others were lost and continue on
its own (``--min-nodes``). Before a generation starts, its chief claims it
by an exclusive create of ``<run_dir>/generations/<g>.json`` holding its
members (a hard link of a complete file: the name appears whole or not at
all). A claim succeeds only if it extends the lineage: generation ``g-1``'s
claim names the members this group ran with. So of two groups, the first to
claim continues, and the other stops, even one that goes on to a later
generation number on its own. Object storage can do the same with a
conditional put (``If-None-Match: *``); not built.

This protects only where every node sees the same run directory (a shared
file system, as its checkpoints need); a node-local run directory leaves
the deterministic rule alone (docs/architecture.md).

The same directory lets a node that comes back **rejoin**: every launcher
of a job touches ``alive-<rank>`` every second (saying the generation it
runs, or ``join`` while it waits to rejoin). A launcher that starts where
the job has not ended (no ``end.json``), and finds its own alive file (it
was here before: a relaunch) or a generation after the first, while another
launcher's is fresh, asks to join (``join-<rank>``) instead of starting a
job (``arrival``); the chief preempts its generation (the workers
checkpoint), and the next generation, claimed with the newcomer, tells it
where to start (members, checkpoint, restarts used). Whoever ends the job
(its final chief, or the lowest survivor of a lost chief) writes
``end.json``; only then, or with nobody alive, may a chief start a new job
here, which removes the old claims: generation numbers never restart under
a running job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

#: under the run directory
CLAIMS_DIR = "generations"
#: how often a running launcher touches its alive file, and when it is stale
ALIVE_EVERY = 1.0
ALIVE_STALE = 10.0
#: what a launcher says in its alive file while it waits to rejoin, and while it
#: waits for a new job's first claim: it runs no generation of the job here
JOINING, STARTING = "join", "new"
NEW, REJOIN = "new", "rejoin"


@dataclasses.dataclass(frozen=True)
class Claim:
    generation: int
    members: tuple[int, ...]
    checkpoint: Optional[str] = None
    steps: Optional[int] = None
    #: restarts the job had used when it started this generation
    restarts: int = 0


@dataclasses.dataclass(frozen=True)
class Survey:
    """What a starting launcher finds in the run directory."""

    ended: bool = False
    #: the newest claimed generation (``None``: none)
    newest: Optional[int] = None
    #: this node's alive file is there: a launcher of this node ran in this job
    was_here: bool = False
    #: another launcher runs a generation here (its alive file is fresh and names one)
    others_running: bool = False
    #: another launcher waits to rejoin (its alive file is fresh and says so)
    others_waiting: bool = False


def arrival(s: Survey) -> str:
    """A starting launcher: start (or take part in) a new job, or rejoin the
    running one (pure). A job runs here while it has claims, no end marker
    and another launcher running a generation. A launcher that was here
    before is a relaunch whatever generation runs (even the first: the others
    may not have noticed its loss yet); one that was not is a late member of
    a new job while generation 0 is the newest, else a node coming back. A
    job whose every running launcher died while others wait to rejoin it is
    not over either: a relaunch waits with them (``Claims.adopt``)."""
    if s.ended or s.newest is None:
        return NEW
    if s.others_running:
        return REJOIN if s.was_here or s.newest > 0 else NEW
    return REJOIN if s.was_here and s.others_waiting else NEW


def lineage(generation: int, members: tuple[int, ...], previous: tuple[int, ...],
            before: Optional[tuple[int, ...]], taken: Optional[tuple[int, ...]]) -> Optional[str]:
    """May a group that ran ``previous`` (claimed as ``before``) claim
    ``generation`` for ``members`` (already claimed by ``taken``)? ``None``:
    yes, else why not (pure). Generation ``g-1`` must be this group's own:
    a missing one means a new job removed the claims."""
    if generation > 0 and before != previous:
        ran = ("is not in the run directory (a new job started there)" if before is None
               else f"ran on {_nodes(before)}, not on this group's {_nodes(previous)}: another "
                    f"group of nodes continued the job")
        return f"generation {generation - 1} of this job {ran}"
    if taken is None or taken == members:
        return None
    return f"generation {generation} of this job was already started by {_nodes(taken)}"


def superseded(generation: int, members: tuple[int, ...], own: Optional[tuple[int, ...]],
               newest: Optional[Claim]) -> Optional[str]:
    """A running generation whose claims say it is over (pure): a later
    generation was claimed, or (after the first) its own claim is gone or
    names other nodes. ``None``: it may go on."""
    if generation > 0 and own != members:
        return f"the claim of its generation {generation} is gone from the run directory"
    if own == members and newest is not None and newest.generation > generation:
        return (f"generation {newest.generation} was claimed by {_nodes(newest.members)} "
                f"while this node ran generation {generation}")
    return None


def _nodes(members: tuple[int, ...]) -> str:
    return f"node{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}"


class Claims:
    def __init__(self, run_dir: pathlib.Path) -> None:
        self.dir = run_dir / CLAIMS_DIR

    def start(self, members: tuple[int, ...]) -> None:
        """Generation 0's chief (``arrival`` said ``NEW``): a new job; an
        earlier job's claims go."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._create(0, members)
        self.touch(members[0], 0)

    def read(self, generation: int) -> Optional[tuple[int, ...]]:
        """The members that claimed ``generation`` (``None``: unclaimed or unreadable)."""
        claim = self.load(generation)
        return None if claim is None else claim.members

    def load(self, generation: int) -> Optional[Claim]:
        try:
            raw = json.loads((self.dir / f"{generation}.json").read_text("utf-8"))
            claim = Claim(**raw) if isinstance(raw, dict) else None
        except (OSError, ValueError, TypeError):
            return None
        if claim is None or not isinstance(claim.members, list) or not all(
                type(m) is int for m in claim.members):
            return None
        return dataclasses.replace(claim, members=tuple(claim.members))

    def stamp(self, generation: int) -> Optional[tuple[int, int]]:
        """Which file claims ``generation`` (its inode and time), to notice a new one."""
        try:
            st = (self.dir / f"{generation}.json").stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def newest(self) -> Optional[Claim]:
        try:
            numbers = [int(p.stem) for p in self.dir.glob("*.json") if p.stem.isdigit()]
        except OSError:
            return None
        return self.load(max(numbers)) if numbers else None

    def claim(self, generation: int, members: tuple[int, ...],
              previous: tuple[int, ...], **resume: Any) -> Optional[str]:
        """Claim ``generation`` for ``members``, who ran ``previous`` before:
        ``None`` when this group may start it, else why not (one line).
        Every continuing member claims (the same claim again is fine), so no
        member starts a generation that is not claimed for it."""
        why = lineage(generation, members, previous, self.read(generation - 1), None)
        if why is None and not self._create(generation, members, **resume):
            why = lineage(generation, members, previous, self.read(generation - 1),
                          self.read(generation) or ())
        return why

    def superseded(self, generation: int, members: tuple[int, ...]) -> Optional[str]:
        """Why the running ``generation`` must stop (``superseded``), if it must."""
        if self.ended():
            return None  # a new job's launcher before its chief removed the old claims
        return superseded(generation, members, self.read(generation), self.newest())

    def _create(self, generation: int, members: tuple[int, ...], **resume: Any) -> bool:
        """Exclusive, and whole: False if the generation is claimed already."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".claim-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"generation": generation, "members": list(members), **resume}, f)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, self.dir / f"{generation}.json")  # EEXIST: someone was first
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    # ------------------------------------------------------------------ rejoin
    def touch(self, me: int, running: object = 0) -> None:
        """This launcher runs generation ``running`` (or waits to rejoin:
        ``JOINING``), every ``ALIVE_EVERY`` seconds."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / f"alive-{me}").write_text(str(running))
        except OSError:
            pass

    def survey(self, me: int) -> Survey:
        """What a starting launcher of node ``me`` finds (``arrival`` decides)."""
        newest = self.newest()
        was_here = (self.dir / f"alive-{me}").exists()
        self.touch(me, STARTING)
        running, waiting = self.census(me)
        return Survey(self.ended(), None if newest is None else newest.generation,
                      was_here, bool(running), bool(waiting - {me}))

    def census(self, me: int) -> tuple[set[int], set[int]]:
        """(the other nodes running a generation here, the nodes waiting to
        rejoin): those whose alive files are fresh, by the file system's
        clock (``me``'s file, just touched: the nodes' clocks may differ)."""
        try:
            now = (self.dir / f"alive-{me}").stat().st_mtime
        except OSError:
            now = time.time()
        running: set[int] = set()
        waiting: set[int] = set()
        for path in self.dir.glob("alive-*"):
            node = path.name[len("alive-"):]
            try:
                fresh = now - path.stat().st_mtime < ALIVE_STALE
                says = path.read_text()
            except OSError:
                continue
            if fresh and node.isdigit():
                if says.isdigit() and int(node) != me:
                    running.add(int(node))
                elif says == JOINING:
                    waiting.add(int(node))
        return running, waiting

    def adopt(self, me: int,
              progress: Callable[[], tuple[Optional[str], Optional[int]]]) -> None:
        """Waiting to rejoin a job that no launcher runs any more (all of its
        generation's launchers died): the lowest waiting node claims the next
        generation for the waiting nodes, from the newest checkpoint
        (``progress``: its id and steps, read only then: a waiting node calls
        this 5 times a second, and the read may ask object storage), so the
        job goes on instead of everyone waiting for no one."""
        newest = self.newest()
        self.touch(me, JOINING)
        running, waiting = self.census(me)
        group = tuple(sorted(waiting | {me}))
        if newest is None or running or self.ended() or group[0] != me:
            return
        try:  # a fresh claim: its members are starting it (their alive files say so soon)
            claimed = self.dir / f"{newest.generation}.json"
            if (self.dir / f"alive-{me}").stat().st_mtime - claimed.stat().st_mtime < ALIVE_STALE:
                return
        except OSError:
            return
        checkpoint, steps = progress()
        self.claim(newest.generation + 1, group, newest.members, checkpoint=checkpoint,
                   steps=steps, restarts=newest.restarts + 1)

    def ended(self) -> bool:
        return (self.dir / "end.json").exists()

    def end(self) -> None:
        """The job ended (the final chief): no one waits to rejoin it."""
        try:
            (self.dir / "end.json").write_text("{}")
        except OSError:
            pass

    def ask_to_join(self, me: int) -> None:
        (self.dir / f"join-{me}").touch()

    def joiners(self) -> tuple[int, ...]:
        """The nodes that asked to join."""
        names = (p.name[len("join-"):] for p in self.dir.glob("join-*"))
        return tuple(sorted(int(n) for n in names if n.isdigit()))

    def forget_joins(self, members: tuple[int, ...]) -> None:
        """The nodes of a new claim have joined."""
        for m in members:
            try:
                (self.dir / f"join-{m}").unlink()
            except OSError:
                pass
