"""Which launchers of a ``--min-nodes`` job are here: alive and join files.

Every launcher of a job writes ``alive-<rank>`` every ``ALIVE_EVERY``
seconds (the generation it runs, ``join`` while it waits to rejoin, ``new``
while it waits for a new job's first claim); one that wants to rejoin writes
``join-<rank>``. Both are signed (``signed_files``), and a rank that is not
one of the job's nodes is ignored and named, like an unsigned file: a
stray ``join-7`` in a 2-node job must not make its chief preempt for a
node that does not exist (docs/elastic.md).
"""

from __future__ import annotations

import time
from typing import Optional

from determined_launch.launch.signed_files import ClaimFiles

#: how often a running launcher touches its alive file, and when it is stale
ALIVE_EVERY = 1.0
ALIVE_STALE = 10.0
#: what a launcher says in its alive file while it waits to rejoin, and while it
#: waits for a new job's first claim: it runs no generation of the job here
JOINING, STARTING = "join", "new"
ALIVE, JOIN = "alive-", "join-"


def rank_of(name: str, prefix: str, num_nodes: int) -> Optional[int]:
    """The node a presence file names (pure): ``None`` unless ``name`` is
    ``prefix`` + a rank of this ``num_nodes``-node job, written plainly."""
    tail = name[len(prefix):] if name.startswith(prefix) else ""
    if not tail.isdigit() or not tail.isascii() or str(int(tail)) != tail:
        return None
    rank = int(tail)
    return rank if rank < num_nodes else None


class Presence:
    """The alive and join files of the job's ``num_nodes`` nodes in ``files``."""

    def __init__(self, files: ClaimFiles, num_nodes: int) -> None:
        self.files = files
        self.num_nodes = num_nodes

    def touch(self, me: int, running: object = 0) -> None:
        """This launcher runs generation ``running`` (or waits to rejoin:
        ``JOINING``), every ``ALIVE_EVERY`` seconds."""
        self.files.write(f"{ALIVE}{me}", str(running))

    def was_here(self, me: int) -> bool:
        """A launcher of node ``me`` ran in this job (its alive file is this job's)."""
        return self.files.read(f"{ALIVE}{me}") is not None

    def census(self, me: int) -> tuple[set[int], set[int]]:
        """(the other nodes running a generation here, the nodes waiting to
        rejoin): those whose alive files are fresh, by the file system's
        clock (``me``'s file, just touched: the nodes' clocks may differ)."""
        own = self.files.stat(f"{ALIVE}{me}")
        now = time.time() if own is None else own.st_mtime
        running: set[int] = set()
        waiting: set[int] = set()
        for node, name in self._ranks(ALIVE):
            st = self.files.stat(name)
            if st is None or now - st.st_mtime >= ALIVE_STALE:
                continue
            says = self.files.read(name)
            if says is None:
                continue
            if says.isdigit() and node != me:
                running.add(node)
            elif says == JOINING:
                waiting.add(node)
        return running, waiting

    def others_seen(self, me: int) -> bool:
        """A launcher of another node of this job wrote its alive file here
        (ever: with node-local run directories none does)."""
        return any(node != me and self.files.read(name) is not None
                   for node, name in self._ranks(ALIVE))

    def ask_to_join(self, me: int) -> None:
        self.files.write(f"{JOIN}{me}", "join")

    def joiners(self) -> tuple[int, ...]:
        """The nodes that asked to join (signed, and nodes of this job)."""
        return tuple(sorted(node for node, name in self._ranks(JOIN)
                            if self.files.read(name) is not None))

    def forget_joins(self, members: tuple[int, ...]) -> None:
        """The nodes of a new claim have joined."""
        for m in members:
            self.files.unlink(f"{JOIN}{m}")

    def _ranks(self, prefix: str) -> list[tuple[int, str]]:
        """(rank, file name) of the ``prefix`` files; one naming no node of this job is told."""
        found = []
        for name in self.files.names():
            if not name.startswith(prefix):
                continue
            node = rank_of(name, prefix, self.num_nodes)
            if node is None:
                self.files.tell(name, f"names no node of this {self.num_nodes}-node job")
            else:
                found.append((node, name))
        return found
