"""Generation claims: two groups of survivors never both continue one job.

When nodes lose sight of each other (a partition, a chief that is only
silent), each group may decide that the others were lost and continue on
its own (``--min-nodes``). Before a generation starts, its chief claims it
by an exclusive create of ``<run_dir>/generations/<g>.json`` holding its
members (a hard link of a complete file: the name appears whole or not at
all). A claim succeeds only if it extends the lineage: generation ``g-1``'s
claim names the members this group ran with. So of two groups, the first to
claim continues, and the other stops, even one that goes on to a later
generation number on its own. With S3, GCS or Azure checkpoint storage the same
files live in the bucket instead, created by a conditional put (``If-None-Match:
*``; ``bucket_claims``): then no node needs a shared run directory.

Every file there is signed with a key derived from the job secret and
written and read without following links (``signed_files``); a claim whose
signature, generation or members do not fit this job is ignored and named
once (``parse_claim``): writing into a shared run directory cannot stop a
job's nodes or make them follow a forged membership.

In a run directory this protects only where every node sees the same one (a
shared file system); with node-local run directories (and no S3 bucket) a
surviving node that finds no claim of generation 0 says the run directory
is not shared, and stops (``generations.not_shared``).

The same directory lets a node that comes back **rejoin** (``presence``):
every launcher of a job touches ``alive-<rank>`` every second (saying the generation it
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
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from determined_launch.errors import LaunchError
from determined_launch.launch.presence import (  # noqa: F401  (re-exported: the launcher's names)
    ALIVE,
    ALIVE_EVERY,
    ALIVE_STALE,
    JOINING,
    STARTING,
    Presence,
)
from determined_launch.launch.signed_files import ClaimFiles, SignedDir, say

if TYPE_CHECKING:
    from determined_launch.core.storage.spec import StorageSpec

NEW, REJOIN = "new", "rejoin"
END = "end.json"
#: checkpoint storage that keeps the claims (conditional writes: ``bucket_claims``)
BUCKET_PROTOCOLS = ("s3", "gs", "az")
#: the job's newest checkpoint, where the run directories are the nodes' own (``SharedProgress``)
PROGRESS = "progress.json"


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


def parse_claim(generation: int, text: str, num_nodes: int) -> Union[Claim, str]:
    """The claim of ``generation`` in a (signed) file's ``text``, or why it
    is none (pure): its generation must be the file's, its members distinct
    nodes of this ``num_nodes``-node job in ascending order, the rest typed."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(raw, dict) or set(raw) - _FIELDS:
        return "not a claim"
    members, restarts = raw.get("members"), raw.get("restarts", 0)
    checkpoint, steps = raw.get("checkpoint"), raw.get("steps")
    if raw.get("generation") != generation or type(raw.get("generation")) is not int:
        return f"it claims generation {raw.get('generation')!r}, not {generation}"
    if not (isinstance(members, list) and members and all(type(m) is int for m in members)
            and members == sorted(set(members)) and 0 <= members[0]
            and members[-1] < num_nodes):
        return f"its members {members!r} are not nodes of this {num_nodes}-node job"
    if type(restarts) is not int or restarts < 0 or not (
            checkpoint is None or isinstance(checkpoint, str)) or not (
            steps is None or (type(steps) is int and steps >= 0)):
        return "its checkpoint, steps or restarts are malformed"
    return Claim(generation, tuple(members), checkpoint, steps, restarts)


_FIELDS = {f.name for f in dataclasses.fields(Claim)}


def _nodes(members: tuple[int, ...]) -> str:
    return f"node{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}"


class Claims(Presence):
    """The claims of a ``num_nodes``-node job in ``run_dir``, signed with a
    key derived from ``secret`` (its presence files too: ``Presence``), or
    in ``files`` (a bucket: ``bucket_claims``)."""

    def __init__(self, run_dir: pathlib.Path, secret: str, num_nodes: int,
                 say: Callable[[str], None] = say, files: Optional[ClaimFiles] = None) -> None:
        super().__init__(files or SignedDir(run_dir, secret, say), num_nodes)
        self.dir: Union[pathlib.Path, str] = self.files.path
        #: every node sees these claims (a bucket), whatever its run directory
        self.shared = files is not None

    @classmethod
    def open(cls, run_dir: pathlib.Path, secret: str, num_nodes: int,
             storage: Optional[StorageSpec] = None, job: str = "job") -> Claims:
        """The launcher's: in the S3 bucket (Azure container) of ``storage``
        (the checkpoint storage) under ``job``, else in ``run_dir``. A run directory that
        others may write, or a store this user cannot write, is refused
        (LaunchError: one line, exit status 2)."""
        if storage is not None and storage.protocol in BUCKET_PROTOCOLS:
            from determined_launch.core.storage.objectstore import make_filesystem
            from determined_launch.launch.bucket_claims import SignedBucket

            bucket = SignedBucket(make_filesystem(storage), storage.url, job, secret)
            why = bucket.unwritable()
            if why is not None:
                raise LaunchError(f"{why}; --min-nodes keeps its nodes' claims in the "
                                  f"checkpoint storage's bucket")
            return cls(run_dir, secret, num_nodes, files=bucket)
        try:
            claims = cls(run_dir, secret, num_nodes)
        except OSError as e:
            raise LaunchError(f"run directory {run_dir}: {e.strerror}; --min-nodes keeps its "
                              f"nodes' claims there") from None
        why = claims.files.refusal()
        if why is not None:
            raise LaunchError(why)
        why = claims.files.unwritable()
        if why is not None:
            raise LaunchError(f"run directory {run_dir}: {why}; --min-nodes keeps its nodes' "
                              f"claims there (set DET_RUN_DIR to a directory this user can write)")
        return claims

    def start(self, members: tuple[int, ...], checkpoint: Optional[str] = None,
              steps: Optional[int] = None) -> None:
        """Generation 0's chief (``arrival`` said ``NEW``): a new job; an
        earlier job's claims go. In a bucket the claim names the checkpoint
        it starts from (node-local run directories know different ones: the
        others take the chief's, ``generations.first_generation``), published
        again for survivors of a chief lost before its first commit."""
        self.files.reset()
        resume = {"checkpoint": checkpoint, "steps": steps} if self.shared and checkpoint else {}
        self._create(0, members, **resume)
        if resume:
            self.files.write(PROGRESS, json.dumps(resume))
        self.touch(members[0], 0)

    def read(self, generation: int) -> Optional[tuple[int, ...]]:
        """The members that claimed ``generation`` (``None``: unclaimed or unreadable)."""
        claim = self.load(generation)
        return None if claim is None else claim.members

    def load(self, generation: int) -> Optional[Claim]:
        """``generation``'s claim if this job signed it and it fits the job (else told once)."""
        name = f"{generation}.json"
        text = self.files.read(name)
        if text is None:
            return None
        claim = parse_claim(generation, text, self.num_nodes)
        if isinstance(claim, str):
            self.files.tell(name, claim)
            return None
        return claim

    def stamp(self, generation: int) -> Optional[tuple[int, int]]:
        """Which file claims ``generation`` (its inode and time), to notice a new one."""
        st = self.files.stat(f"{generation}.json")
        return None if st is None else (st.st_ino, st.st_mtime_ns)

    def newest(self) -> Optional[Claim]:
        """The newest valid claim (one that is not this job's hides no older one)."""
        numbers = sorted((int(n[:-5]) for n in self.files.names()
                          if n.endswith(".json") and n[:-5].isdigit() and n[:-5].isascii()),
                         reverse=True)
        for number in numbers:
            claim = self.load(number)
            if claim is not None:
                return claim
        return None

    def claim(self, generation: int, members: tuple[int, ...],
              previous: tuple[int, ...], **resume: Any) -> Optional[str]:
        """Claim ``generation`` for ``members``, who ran ``previous`` before:
        ``None`` when this group may start it, else why not (one line).
        Every continuing member claims (the same claim again is fine), so no
        member starts a generation that is not claimed for it."""
        why = lineage(generation, members, previous, self.read(generation - 1), None)
        if why is None and not self._create(generation, members, **resume):
            taken = self.read(generation)
            why = lineage(generation, members, previous, self.read(generation - 1), taken) if (
                taken is not None) else (f"generation {generation} of this job cannot be "
                                         f"claimed: {self.dir}/{generation}.json is not its claim")
        return why

    def superseded(self, generation: int, members: tuple[int, ...]) -> Optional[str]:
        """Why the running ``generation`` must stop (``superseded``), if it must."""
        if self.ended():
            return None  # a new job's launcher before its chief removed the old claims
        return superseded(generation, members, self.read(generation), self.newest())

    def _create(self, generation: int, members: tuple[int, ...], **resume: Any) -> bool:
        """Exclusive, and whole: False if the generation is claimed already."""
        text = json.dumps({"generation": generation, "members": list(members), **resume})
        return self.files.write(f"{generation}.json", text, exclusive=True)

    # ------------------------------------------------------------------ rejoin
    def survey(self, me: int) -> Survey:
        """What a starting launcher of node ``me`` finds (``arrival`` decides)."""
        newest = self.newest()
        was_here = self.was_here(me)
        self.touch(me, STARTING)
        running, waiting = self.census(me)
        return Survey(self.ended(), None if newest is None else newest.generation,
                      was_here, bool(running), bool(waiting - {me}))

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
        # a fresh claim: its members are starting it (their alive files say so soon)
        own, claimed = self.files.stat(f"{ALIVE}{me}"), self.files.stat(
            f"{newest.generation}.json")
        if own is None or claimed is None or own.st_mtime - claimed.st_mtime < ALIVE_STALE:
            return
        checkpoint, steps = progress()
        self.claim(newest.generation + 1, group, newest.members, checkpoint=checkpoint,
                   steps=steps, restarts=newest.restarts + 1)

    def published(self) -> Optional[tuple[str, Optional[int]]]:
        """The newest checkpoint a node of this job published (``SharedProgress``)."""
        text = self.files.read(PROGRESS)
        raw = _json(text) if text is not None else None
        if not isinstance(raw, dict) or not isinstance(raw.get("checkpoint"), str):
            return None
        steps = raw.get("steps")
        return raw["checkpoint"], steps if type(steps) is int and steps >= 0 else None

    def ended(self) -> bool:
        return self.files.read(END) is not None

    def end(self) -> None:
        """The job ended (the final chief): no one waits to rejoin it."""
        self.files.write(END, "{}")


class SharedProgress:
    """Where the claims are in a bucket and every node has its own run
    directory, only the chief's records the job's checkpoints; survivors of a
    lost chief would resume from the start. So a node whose run directory
    gets a newer checkpoint (this launcher's workers committed it) publishes
    it in the bucket (``publish``, every second), and the restart decision
    reads the published one (``__call__``: ``read``'s kind, ``Progress``)."""

    def __init__(self, claims: Claims, read: Callable[[], Any]) -> None:
        self.claims, self.read = claims, read
        self.seen = read().checkpoint  # an older launcher's record is not news

    def publish(self) -> Any:
        """This node's newest checkpoint, published if it is new here."""
        local = self.read()
        if local.checkpoint is not None and local.checkpoint != self.seen:
            text = json.dumps({"checkpoint": local.checkpoint, "steps": local.steps})
            if self.claims.files.write(PROGRESS, text):
                self.seen = local.checkpoint
        return local

    def __call__(self) -> Any:
        local = self.publish()
        found = self.claims.published()
        if found is None or found[0] == local.checkpoint:
            return local
        return dataclasses.replace(local, checkpoint=found[0], steps=found[1])


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
