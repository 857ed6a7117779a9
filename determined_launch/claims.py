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
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from typing import Optional

#: under the run directory
CLAIMS_DIR = "generations"


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
        try:
            raw = json.loads((self.dir / f"{generation}.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None
        members = raw.get("members") if isinstance(raw, dict) else None
        if not isinstance(members, list) or not all(type(m) is int for m in members):
            return None
        return tuple(members)

    def claim(self, generation: int, members: tuple[int, ...],
              previous: tuple[int, ...]) -> Optional[str]:
        """Claim ``generation`` for ``members``, who ran ``previous`` before:
        ``None`` when this group may start it, else why not (one line)."""
        before = self.read(generation - 1)
        if before is not None and before != previous:
            return (f"generation {generation - 1} of this job ran on {_nodes(before)}, not on "
                    f"this group's {_nodes(previous)}: another group of nodes continued the job")
        if self._create(generation, members):
            return None
        taken = self.read(generation)
        if taken == members:
            return None
        who = _nodes(taken) if taken is not None else "another group of nodes"
        return f"generation {generation} of this job was already started by {who}"

    def _create(self, generation: int, members: tuple[int, ...]) -> bool:
        """Exclusive, and whole: False if the generation is claimed already."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".claim-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"generation": generation, "members": list(members)}, f)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, self.dir / f"{generation}.json")  # EEXIST: someone was first
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
