"""``--max-restarts`` and ``--min-nodes``: the launcher's memory across generations.

The supervisor runs one generation (one start of the workers) and asks, as
it ends, whether to restart; ``restart_judge.Restarts`` answers. This module
runs the generations one after another: the first (a new job, or a node
rejoining a running one), each restart, and, under ``--min-nodes``, the
claims that keep survivors to one group (``claims.py``).

Nodes keep their *original* rank (their place in the job's first node
list) as their identity across generations; a generation's cluster info is
the original one narrowed to its members (``membership_info``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import sys
import threading
import time
from typing import Callable, Optional

from determined_launch.cluster.info import ClusterInfo
from determined_launch.launch.claims import (
    ALIVE_EVERY,
    JOINING,
    REJOIN,
    STARTING,
    Claim,
    Claims,
    SharedProgress,
    arrival,
)
from determined_launch.launch.restart_judge import Restarts
from determined_launch.supervisor.peers import UNREACHED
from determined_launch.supervisor.restarts import Decision, Progress, nodes


def membership_info(original: ClusterInfo, members: tuple[int, ...],
                    checkpoint: Optional[str]) -> ClusterInfo:
    """A generation's cluster info: the original node list narrowed to
    ``members`` (original ranks, ascending: the first is the chief, whose
    address every node knows from the original list), resuming from
    ``checkpoint``. Its ports are its own (``generation_ports``)."""
    return dataclasses.replace(
        original,
        container_addrs=tuple(original.container_addrs[m] for m in members),
        container_slot_counts=tuple(original.container_slot_counts[m] for m in members),
        container_rank=members.index(original.container_rank),
        latest_checkpoint=checkpoint)


@dataclasses.dataclass(frozen=True)
class Generation:
    """What one start of this node's workers runs with."""

    number: int
    info: ClusterInfo
    #: its nodes, by original rank
    members: tuple[int, ...]
    judge: Optional[Restarts]
    #: signals the previous generation kept pending for this one
    deferred: frozenset[int] = frozenset()
    #: nodes (original ranks) that ask to rejoin (``--min-nodes``; the chief preempts for them)
    joining: Optional[Callable[[], tuple[int, ...]]] = None
    #: why the claims say this generation is over (``--min-nodes``), if they do
    superseded: Optional[Callable[[], Optional[str]]] = None


def run_generations(info: ClusterInfo, judge: Optional[Restarts],
                    one: Callable[[Generation], tuple[int, Decision, frozenset[int]]],
                    claims: Optional[Claims] = None, join_timeout: float = 300.0,
                    claim_wait: float = 10.0) -> tuple[int, ClusterInfo]:
    """Run generations until one is not restarted: (its exit status, its info).

    ``claims`` (``--min-nodes``): the generation's claims in the run
    directory. Every generation after the first is claimed before any of its
    members starts it, and a generation stops when a later one is claimed, so
    two groups of nodes that lost sight of each other never both continue; a
    launcher that finds the job running without it asks to rejoin and waits
    (at most ``join_timeout``) for the generation that takes it."""
    me, everyone = info.container_rank, tuple(range(info.num_nodes))
    gen: Optional[Generation] = Generation(0, info, everyone, judge)
    alive = threading.Event()
    unseen = False  # generation 0 ran here, and no claim of it was ever here
    running: list[object] = [0]  # the generation this node runs, for its alive file
    publish: Optional[Callable[[], object]] = None
    if claims is not None and judge is not None:
        if claims.shared:  # node-local run directories: checkpoints are known through the bucket
            judge.read = shared = SharedProgress(claims, judge.read)
            publish = shared.publish
        first = claims.stamp(0)  # a new job's chief replaces it
        found = claims.survey(me)
        rejoin = arrival(found) == REJOIN
        resume = judge.read() if claims.shared and info.is_chief and not rejoin else None
        if rejoin:
            running[0] = JOINING
        elif info.is_chief:
            claims.start(everyone, *((resume.checkpoint, resume.steps) if resume else ()))
        elif found.ended or found.newest != 0 or not found.others_running:
            running[0] = STARTING  # until this job's chief claims generation 0
        threading.Thread(target=_keep_alive, args=(claims, me, running, alive, first, publish),
                         daemon=True).start()
        if rejoin:
            gen = _rejoin(info, judge, claims, join_timeout)
            running[0] = gen.number if gen else JOINING
        elif claims.shared and gen is not None:
            gen = first_generation(gen, claims, None if running[0] == STARTING else first,
                                   first, max(claim_wait, 30.0), resume)
    try:
        while gen is not None:
            if claims is not None:
                gen = dataclasses.replace(
                    gen, joining=claims.joiners,
                    superseded=functools.partial(claims.superseded, gen.number, gen.members))
            status, decision, deferred = one(gen)
            if claims is not None and judge is not None and gen.number == 0 and (
                    running[0] == STARTING and judge.attempts):  # connected, but no claim came
                unseen = UNREACHED not in judge.attempts[-1].cause and claims.stamp(0) is None
            if not decision.restart and claims is not None and judge is not None:
                newer = claims.newest()  # superseded by a generation that takes this node in?
                if status != 0 and newer is not None and newer.generation > gen.number and (
                        me in newer.members):  # (not after the job succeeded: nothing to resume)
                    running[0] = newer.generation
                    claims.touch(me, running[0])
                    gen = _take(info, judge, newer)
                    continue
                if _ends_job(judge, gen, claims):
                    claims.end()
                if status != 0 and gen.number > 0 and not claims.shared and (
                        not claims.others_seen(me)):  # the peers' words were "never connected"
                    _say(not_shared(claims.dir, gen.members[0], me))
            if not decision.restart:
                return status, gen.info
            members = decision.members or gen.members
            running[0] = decision.generation  # said before the claim: a returning node reads
            if claims is not None:            # both and must see the job running
                claims.touch(me, running[0])
            nxt = Generation(decision.generation,
                             membership_info(info, members, decision.resume.checkpoint),
                             members, judge, deferred)
            if claims is not None and judge is not None:
                # The chief that continues claims once every node hung up (no old worker
                # left); the others wait for its claim, or claim the same after a while.
                if me != gen.members[0] and gen.members[0] in members:
                    _wait_for_claim(claims, nxt.number, claim_wait)
                why = claims.claim(nxt.number, members, gen.members, restarts=judge.used(),
                                   checkpoint=decision.resume.checkpoint,
                                   steps=decision.resume.steps)
                if why is not None:
                    if not claims.shared and (unseen and decision.generation == 1 or (
                            claims.stamp(0) is None)):  # no job ever claimed here: not shared
                        why = not_shared(claims.dir, gen.members[0])
                    _say(f"not restarting: {why}; exit status {status}")
                    return status, gen.info
                claims.forget_joins(members)
            gen = nxt
        return 1, info
    finally:
        alive.set()


def first_generation(gen: Generation, claims: Claims, ours: Optional[tuple[int, int]],
                     old: Optional[tuple[int, int]], wait: float,
                     resume: Optional[Progress]) -> Generation:
    """A new job's generation 0 on node-local run directories (claims in a
    bucket): every node starts from the checkpoint the chief's claim names,
    not from its own run directory's newest (another node's may be older or
    none: workers at different steps). The chief's is ``resume`` (its own
    or the published one, ``SharedProgress``); a node waits at most ``wait``
    seconds for this job's claim (stamp ``ours`` once known, not the earlier
    job's ``old``); without one it keeps its own."""
    if resume is not None:
        return _starting_from(gen, resume.checkpoint, "the newest this job published")
    deadline = time.monotonic() + wait
    while True:
        stamp = claims.stamp(0)
        if stamp is not None and (stamp == ours or stamp != old):
            claim = claims.load(0)
            if claim is not None:
                return _starting_from(gen, claim.checkpoint, "the one the chief's claim names")
        if time.monotonic() > deadline:
            return gen
        time.sleep(0.1)


def _starting_from(gen: Generation, checkpoint: Optional[str], which: str) -> Generation:
    """``gen`` resuming from ``checkpoint``; a line when that is not what this
    node's run directory said a moment ago (``info.latest_checkpoint``), so the
    earlier resume line is not the last word."""
    own = gen.info.latest_checkpoint
    if checkpoint != own:
        _say(f"node {gen.info.container_rank} starts from checkpoint {checkpoint or '(none)'}, "
             f"{which}, not {own or 'a fresh start'} as its own run directory said")
    return dataclasses.replace(gen, info=membership_info(gen.info, gen.members, checkpoint))


def not_shared(where: object, chief: int, me: Optional[int] = None) -> str:
    """Why survivors on node-local run directories cannot continue (one line):
    a worker never saw the chief's claims, the chief (``me``) never saw
    another node's alive file."""
    saw = ("the chief's launcher (node {chief}) connected, but never saw its claim" if (
        me != chief) else "the other nodes connected, but never saw their launchers' alive files")
    return (f"the run directory is not shared: this node ran generation 0 with "
            f"{saw.format(chief=chief)} in {where}; --min-nodes "
            f"needs one run directory that every node sees (a shared file system) or S3, "
            f"GCS or Azure checkpoint storage (the claims go to its bucket)")


def _ends_job(judge: Restarts, gen: Generation, claims: Claims) -> bool:
    """This node's generation ended the job: it is the generation's chief, or
    the lowest survivor of its lost chief (every survivor decided alone), and
    no later generation took over (it was not left out or superseded)."""
    lost = judge.attempts[-1].lost if judge.attempts else ()
    left = [m for m in gen.members if m not in lost]
    return bool(left) and left[0] == judge.me and claims.superseded(
        gen.number, gen.members) is None


def _wait_for_claim(claims: Claims, generation: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while claims.read(generation) is None and time.monotonic() < deadline:
        time.sleep(0.1)


def _keep_alive(claims: Claims, me: int, running: list[object], stop: threading.Event,
                first: Optional[tuple[int, int]],
                publish: Optional[Callable[[], object]] = None) -> None:
    """Touch this node's alive file every ``ALIVE_EVERY`` seconds; a new job's
    node says it runs generation 0 once its chief claimed it (a node started
    again after that is a relaunch: it rejoins)."""
    while True:
        if running[0] == STARTING and claims.stamp(0) not in (None, first):
            running[0] = 0
        claims.touch(me, running[0])
        if publish is not None:
            try:
                publish()
            except Exception:  # noqa: BLE001  (a storage error must not stop the alive file)
                pass
        if stop.wait(ALIVE_EVERY):
            return


def _rejoin(info: ClusterInfo, judge: Restarts, claims: Claims,
            timeout: float) -> Optional[Generation]:
    """Ask the running job to take this node back, and wait for the
    generation that does (``None``: it did not within ``timeout``)."""
    me = info.container_rank
    newest = claims.newest()
    seen = -1 if newest is None else newest.generation
    claims.ask_to_join(me)
    where = f" (generation {seen}, {nodes(newest.members)})" if newest else ""
    _say(f"the job runs here{where} without this launcher of node {me}: asking to rejoin at "
         f"its next checkpoint")
    def progress() -> tuple[Optional[str], Optional[int]]:  # read only to adopt the job
        now = judge.read()
        return now.checkpoint, now.steps

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not claims.ended():
        claims.adopt(me, progress)
        claim = claims.newest()
        if claim is not None and claim.generation < seen and me in claim.members:
            return Generation(0, info, tuple(range(info.num_nodes)), judge)  # a new job here
        if claim is not None and claim.generation > seen and me in claim.members:
            claims.touch(me, claim.generation)  # at once: nobody may take the job for orphaned
            return _take(info, judge, claim)
        time.sleep(0.2)
    claims.forget_joins((me,))
    why = "the job ended" if claims.ended() else f"no generation took it within {timeout:g}s"
    _say(f"node {me} did not rejoin the running job: {why}; exit status 1 (the workers must "
         f"listen for preemption, core.init, for a node to rejoin)")
    return None


def _take(info: ClusterInfo, judge: Restarts, claim: Claim) -> Generation:
    """This node takes part in ``claim``'s generation, which others decided."""
    judge.join_at(claim.generation, claim.members, Progress(claim.checkpoint, claim.steps),
                  claim.restarts)
    return Generation(claim.generation, membership_info(info, claim.members, claim.checkpoint),
                      claim.members, judge)


def _say(line: str) -> None:
    print(f"det-launch: {line}", file=sys.stderr, flush=True)


#: ports a generation moves its three by, per generation (cycling): +3 stays free (det-launch
#: experiment's gang channel is ``C10D_PORT + 3``)
PORT_STRIDE, PORT_CYCLE = 4, 16


def generation_ports(base: int, generation: int) -> tuple[int, int, int]:
    """(master, control, dist) ports of ``generation`` from the job's base
    ``C10D_PORT`` (pure): generation 0 uses the base and the next two, each
    later one its own three (every node computes the same without talking).
    A launcher of an earlier generation that still holds its ports (a
    SIGSTOPped chief on a host it shares with the next chief) cannot block
    the next one; the ports cycle after ``PORT_CYCLE`` generations, and go
    below the base where above would pass 65535."""
    shift = PORT_STRIDE * (generation % PORT_CYCLE)
    if base + shift + 2 > 65535:
        shift = -shift
    return base + shift, base + shift + 1, base + shift + 2


def generation_secret(secret: Optional[str], generation: int,
                      members: tuple[int, ...] = ()) -> Optional[str]:
    """Generation 0 keeps the job's secret; each later one derives its own, so
    the control channel and DistributedContext of an old generation cannot
    authenticate to a new one (every node derives the same key). The
    members are part of it: two groups of survivors that each believe the
    others lost cannot talk to each other's generation."""
    if secret is None or generation == 0:
        return secret
    tail = f"|members {','.join(map(str, members))}" if members else ""
    return hashlib.sha256(f"{secret}|det-launch generation {generation}{tail}".encode()
                          ).hexdigest()
