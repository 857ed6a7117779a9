"""Multi-node trials: one ``det-launch experiment --worker`` per node of an
allocation, each trial run on a group of them.

The allocation is what the cluster detectors found (SLURM, a Kubernetes indexed
Job, a host list...). ``resources.slots_per_trial`` over one node's slots makes
groups of ``slots_per_trial / slots per node`` consecutive nodes; the first node
of a group is the trial's chief. Only the chief's worker talks to the study: it
takes a trial, and before each start of the trial's launcher (first run, restart,
resume) tells the group's other workers over the launchers' own control channel
(``supervisor/control.py``: HMAC-checked lines on ``C10D_PORT + 3``) which trial,
which run and which checkpoint; each starts its node's launcher of that trial,
and says when it ended. Stops (ASHA, the experiment's preemption) go to the
chief's launcher, whose job spreads them to every node; a failure on any node
fails the whole launcher job, and the driver restarts all of it. A run starts
only once every node's launcher of the previous run is gone, and each run has its
own secret, derived on every node, so no old launcher can join a new run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import signal
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any, Callable, Optional

from determined_launch import envvars
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import LaunchError
from determined_launch.experiment.trial import TrialProcess, TrialSpec, latest_checkpoint
from determined_launch.supervisor.control import ChiefLink, ControlError, NodeLink
from determined_launch.supervisor.events import Kind, Message

RUN, EXITED, STOP, END = "trial_run", "trial_exited", "trial_stop", "search_end"
#: seconds a node's launcher may outlive the chief's before it is told to stop
SETTLE = 15.0
#: and after that, before the experiment gives up on it (the two stay under the study's
#: 60 s lease: the chief's heartbeat waits meanwhile)
GIVE_UP = 30.0
#: the group's channel: the port after the trial launchers' three
PORT_OFFSET = 3
#: what the control channel's messages call each end here
PEER = "experiment worker"


class GangError(LaunchError):
    """A node's worker was lost or never came: the experiment stops (trials stay resumable)."""

    exit_status = 1


class Interrupted(LaunchError):
    """Ctrl-C before any trial started: one line, not a traceback."""

    exit_status = 130


@dataclasses.dataclass(frozen=True)
class Gang:
    """Where this node's worker sits: ``nodes`` per trial, its ``group`` of them and
    its ``rank`` in that group (0: the trial's chief); ``info`` is the trial's
    cluster as this node's launcher sees it."""

    nodes: int
    group: int
    rank: int
    info: ClusterInfo


def trial_gang(slots_per_trial: Optional[int], info: ClusterInfo, where: str
               ) -> Optional[Gang]:
    """This node's place in the allocation ``info``, or ``None`` for a node left
    over (the allocation's nodes are not a multiple of a trial's). Pure."""
    counts = info.container_slot_counts
    per = counts[info.container_rank]
    spt = per if slots_per_trial is None else slots_per_trial
    if spt <= per:
        nodes = 1
    elif len(set(counts)) > 1:
        raise LaunchError(f"{where}: resources.slots_per_trial {spt} spans nodes, whose slot "
                          f"counts differ in this allocation ({', '.join(map(str, counts))}); "
                          "a trial across nodes needs the same number on each")
    elif spt % per:
        raise LaunchError(f"{where}: resources.slots_per_trial {spt} is not a multiple of the "
                          f"{per} slots per node of this allocation")
    else:
        nodes = spt // per
    if nodes > info.num_nodes:
        raise LaunchError(f"{where}: resources.slots_per_trial {spt} needs {nodes} nodes of "
                          f"{per} slots; this allocation has {info.num_nodes}")
    group, rank = divmod(info.container_rank, nodes)
    if group >= info.num_nodes // nodes:
        return None
    first = group * nodes
    slots = min(spt, per)  # a trial smaller than a node uses part of it
    trial = ClusterInfo(container_addrs=info.container_addrs[first:first + nodes],
                        container_rank=rank, container_slot_counts=(slots,) * nodes,
                        slot_ids=info.slot_ids[:slots], source=f"experiment ({info.source})",
                        job_secret=info.job_secret, checkpoint_storage=info.checkpoint_storage)
    return Gang(nodes=nodes, group=group, rank=rank, info=trial)


def channel_port(trial_ports: tuple[int, int, int]) -> int:
    return trial_ports[0] + PORT_OFFSET


def derive(secret: str, what: str) -> str:
    """A key every node of the group derives alike from the job secret."""
    return hashlib.sha256(f"{secret}|det-launch experiment {what}".encode()).hexdigest()


def _msg(kind: str, **fields: Any) -> Message:
    return {"type": kind, **fields}


class GangChief:
    """The trial chief's side: waits for the group, then announces every run."""

    def __init__(self, gang: Gang, secret: str, port: int, connect_timeout: float,
                 say: Callable[[str], None]) -> None:
        self.gang = gang
        self.secret = secret
        self.say = say
        self.run = 0
        self.running: set[int] = set()  # nodes whose launcher of this run has not ended
        self.lost: Optional[str] = None
        try:
            self.link = ChiefLink(gang.info.chief_ip, port, gang.nodes,
                                  derive(secret, f"group {gang.group}"), peer=PEER)
        except ControlError as e:
            raise GangError(str(e)) from None
        want = set(range(1, gang.nodes))
        deadline = time.monotonic() + connect_timeout
        try:
            while self.link.connected_nodes != want:
                if time.monotonic() > deadline:
                    missing = sorted(want - self.link.connected_nodes)
                    raise GangError(f"the workers of nodes {missing} of this trial group did "
                                    f"not connect within {connect_timeout:g}s; start det-launch "
                                    "experiment --worker on every node of the allocation")
                time.sleep(0.05)
        except KeyboardInterrupt:
            raise Interrupted("interrupted while waiting for the other nodes' workers") from None
        except GangError:
            self.link.close()
            raise
        self.say(f"{gang.nodes} nodes per trial (group {gang.group}: "
                 f"{', '.join(gang.info.container_addrs)})")

    def check(self) -> Optional[str]:
        """Read what the nodes said; why a node was lost, once one was."""
        while self.link.inbox:
            m = self.link.inbox.popleft()
            if m.get("type") == EXITED and m.get("run") == self.run:
                self.running.discard(int(m["node"]))
            elif m.get("type") == Kind.LOST and self.lost is None:
                self.lost = (f"the experiment's worker on node {m['node']} of this trial "
                             f"group {m['why']}")
        return self.lost

    def settle(self) -> None:
        """Wait until every node's launcher of the last run has ended (and no
        node's worker is gone: a run without it could never start)."""
        start = time.monotonic()
        stopped = False
        while True:
            if self.check() is not None:
                raise GangError(str(self.lost))
            if not self.running:
                return
            waited = time.monotonic() - start
            if waited > SETTLE and not stopped:
                stopped = True
                self.link.broadcast(_msg(STOP, run=self.run))
            if waited > SETTLE + GIVE_UP:
                raise GangError(f"the trial launchers of nodes {sorted(self.running)} did not "
                                f"end within {SETTLE + GIVE_UP:g}s of the chief's")
            time.sleep(0.02)

    def before_start(self, proc: TrialProcess) -> dict[str, str]:
        """``DriverSetup.before_start``: every node starts this run too."""
        self.settle()
        self.run += 1
        s = proc.spec
        self.link.broadcast(_msg(RUN, run=self.run, number=s.number, hparams=dict(s.hparams),
                                 seed=s.seed, experiment_id=s.experiment_id,
                                 max_length=s.max_length, trial_id=s.trial_id,
                                 latest_checkpoint=latest_checkpoint(proc.run_dir)))
        self.running = set(range(1, self.gang.nodes))
        return {envvars.DIST_SECRET: run_secret(self.secret, self.gang.group, self.run)}

    def finish(self, status: int) -> None:
        """The search is over here: the nodes' workers exit with ``status``."""
        try:
            if self.lost is None:
                self.settle()
        except GangError as e:
            self.say(str(e))
        finally:
            self.link.broadcast(_msg(END, status=status))
            time.sleep(0.2)  # the lines leave before the connections close
            self.link.close()


def run_secret(secret: str, group: int, run: int) -> str:
    return derive(secret, f"group {group} run {run}")


@dataclasses.dataclass
class NodeSetup:
    """What a non-chief node's worker needs to run its part of each trial."""

    gang: Gang
    secret: str
    port: int
    connect_timeout: float
    exp_dir: Any  # pathlib.Path
    argv: Sequence[str]
    env: Mapping[str, str]
    checkpoint_storage: str
    metric: str
    say: Callable[[str], None]


def serve_node(s: NodeSetup) -> int:
    """A non-chief node's worker: run this node's launcher of each trial run the
    group's chief announces, until the search ends (its status is ours)."""
    try:
        link = NodeLink(s.gang.info.chief_ip, s.port, s.gang.rank,
                        derive(s.secret, f"group {s.gang.group}"), s.connect_timeout,
                        num_nodes=s.gang.nodes, peer=PEER)
    except KeyboardInterrupt:
        raise Interrupted("interrupted while waiting for the trial chief's worker") from None
    except ControlError as e:
        raise GangError(f"node {s.gang.rank} of trial group {s.gang.group}: {e}") from None
    s.say(f"node {s.gang.rank} of trial group {s.gang.group}: joined its chief at "
          f"{s.gang.info.chief_ip}")
    proc: Optional[TrialProcess] = None
    run = 0
    idle_signal: list[int] = []

    def on_signal(signum: int, _frame: Optional[FrameType]) -> None:
        if proc is not None and proc.proc is not None:  # its launcher preempts the whole trial
            proc.proc.send_signal(signal.SIGTERM)
        else:  # nothing to preempt: leave (the chief stops the group, the trial is resumable)
            idle_signal.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            if idle_signal and proc is None:
                raise Interrupted(f"node {s.gang.rank} of trial group {s.gang.group}: stopped by "
                                  f"{signal.Signals(idle_signal[0]).name} between trials")
            while link.inbox:
                m = link.inbox.popleft()
                kind = m.get("type")
                if kind == RUN:
                    if proc is not None:
                        _wait(proc)  # never two runs at once (the chief waits for this one)
                    run = int(m["run"])
                    proc = _start_run(s, m)
                    s.say(f"trial {proc.spec.trial_id}: started its node {s.gang.rank} "
                          f"(run {run})")
                elif kind == STOP and proc is not None and m.get("run") == run:
                    proc.terminate()
                elif kind == END:
                    return int(m.get("status", 1))
                elif kind == Kind.LOST:
                    if proc is not None:
                        _wait(proc)
                    raise GangError(f"node {s.gang.rank}: the experiment's worker on the "
                                    "trial's chief node was lost")
            if proc is not None and (code := proc.poll()) is not None:
                link.send(_msg(EXITED, run=run, code=code))
                s.say(f"trial {proc.spec.trial_id}: its node {s.gang.rank} ended (run {run}, "
                      f"exit status {code}; {proc.log_path})")
                proc = None
            time.sleep(0.02)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        link.close()


def _start_run(s: NodeSetup, m: Message) -> TrialProcess:
    spec = TrialSpec(number=int(m["number"]), hparams=m["hparams"], seed=int(m["seed"]),
                     experiment_id=m["experiment_id"], max_length=m["max_length"],
                     global_id=m.get("trial_id"))
    proc = TrialProcess(spec, s.exp_dir, s.metric, None, node=s.gang.rank)
    env = {**s.env, envvars.DIST_SECRET: run_secret(s.secret, s.gang.group, int(m["run"]))}
    proc.start(s.gang.info, s.argv, env, s.checkpoint_storage, resume=m["latest_checkpoint"])
    return proc


def _wait(proc: TrialProcess, grace: float = SETTLE) -> None:
    deadline = time.monotonic() + grace
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.terminate()
            deadline = float("inf")
        time.sleep(0.05)
