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
of a running job touches ``alive-<rank>`` every few seconds; a launcher that
starts while another's is fresh, and is not in the newest claim, asks to
join (``join-<rank>``) instead of starting a job; the chief preempts its
generation (the workers checkpoint), and the next generation, claimed with
the newcomer, tells it where to start (members, checkpoint, restarts used).
The final chief writes ``end.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
import time
from typing import Any, Optional

#: under the run directory
CLAIMS_DIR = "generations"
#: how often a running launcher touches its alive file, and when it is stale
ALIVE_EVERY = 2.0
ALIVE_STALE = 20.0


@dataclasses.dataclass(frozen=True)
class Claim:
    generation: int
    members: tuple[int, ...]
    checkpoint: Optional[str] = None
    steps: Optional[int] = None
    #: restarts the job had used when it started this generation
    restarts: int = 0


def _nodes(members: tuple[int, ...]) -> str:
    return f"node{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}"


class Claims:
    def __init__(self, run_dir: pathlib.Path) -> None:
        self.dir = run_dir / CLAIMS_DIR

    def start(self, members: tuple[int, ...]) -> None:
        """Generation 0's chief: a new job; an earlier job's claims go."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._create(0, members)

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

    def newest(self) -> Optional[Claim]:
        try:
            numbers = [int(p.stem) for p in self.dir.glob("*.json") if p.stem.isdigit()]
        except OSError:
            return None
        return self.load(max(numbers)) if numbers else None

    def claim(self, generation: int, members: tuple[int, ...],
              previous: tuple[int, ...], **resume: Any) -> Optional[str]:
        """Claim ``generation`` for ``members``, who ran ``previous`` before:
        ``None`` when this group may start it, else why not (one line)."""
        before = self.read(generation - 1)
        if before is not None and before != previous:
            return (f"generation {generation - 1} of this job ran on {_nodes(before)}, not on "
                    f"this group's {_nodes(previous)}: another group of nodes continued the job")
        if self._create(generation, members, **resume):
            return None
        taken = self.read(generation)
        if taken == members:
            return None
        who = _nodes(taken) if taken is not None else "another group of nodes"
        return f"generation {generation} of this job was already started by {who}"

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
    def touch(self, me: int, generation: int = 0) -> None:
        """This launcher runs ``generation`` (every ``ALIVE_EVERY`` seconds)."""
        try:
            (self.dir / f"alive-{me}").write_text(str(generation))
        except OSError:
            pass

    def live(self, me: int) -> bool:
        """A job runs here now: another launcher running a later generation
        than the first (a new job's launchers say 0) touched its alive file
        lately, and the job has not ended. A launcher that just started is in
        no running generation, even one whose claim still names it (the others
        have not noticed its loss yet): it rejoins."""
        if (self.dir / "end.json").exists():
            return False
        newest = self.newest()
        if newest is None:
            return False
        # The file system's clock, not ours: the nodes' clocks may differ.
        self.touch(me)
        try:
            now = (self.dir / f"alive-{me}").stat().st_mtime
        except OSError:
            now = time.time()
        for path in self.dir.glob("alive-*"):
            try:
                fresh = now - path.stat().st_mtime < ALIVE_STALE
                running = int(path.read_text() or 0)
            except (OSError, ValueError):
                continue
            # claim g+1 may be made while its members still say g
            if path.name != f"alive-{me}" and fresh and running >= max(1, newest.generation - 1):
                return True
        return False

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
