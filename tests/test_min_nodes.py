"""``--min-nodes K``: losing a node (the chief's included) continues on the
others. The pure parts (policy, membership, the survivors' agreement), and
real launchers as simulated nodes on loopback running a Core API worker
whose weight depends on every sample's position."""

from __future__ import annotations

import math
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import LaunchError
from determined_launch.launch import config, generations, restart_judge
from determined_launch.launch.claims import Claims
from determined_launch.supervisor.events import Failure
from determined_launch.supervisor.restarts import Attempt, Decision, Progress, decide
from tests.conftest import (
    WORKERS,
    Launch,
    base_env,
    exec_on_two_nodes,
    free_port_block,
    wait_for_file,
    write_cluster_info,
)

NONE = Progress()
C4 = Progress("ck-4", 4)
LOST2 = "the launcher on node 2 (h2) was lost (its connection closed)"


def lost(members: tuple[int, ...], gone: tuple[int, ...], gen: int = 0,
         cause: str = LOST2) -> Attempt:
    return Attempt(gen, 1, cause, False, NONE, C4, node_lost=True, members=members, lost=gone)


# ------------------------------------------------------------------ the pure policy
def test_a_lost_node_continues_on_the_others_and_uses_a_restart() -> None:
    d = decide(2, [lost((0, 1, 2), (2,))], NONE, min_nodes=2)
    assert d.restart and d.members == (0, 1) and d.resume == C4 and d.generation == 1
    assert d.why == (f"restart 1 of 2 after {LOST2} (generation 0); continuing without node 2 "
                     "on nodes 0, 1; resuming from checkpoint ck-4, steps_completed 4")
    used = [lost((0, 1, 2), (2,)), lost((0, 1), (1,), gen=1)]
    assert decide(1, used, NONE, min_nodes=1).why == "not restarting: all 1 restart used"
    # a second loss is not "the same failure repeated": it continues again
    again = decide(2, used, NONE, min_nodes=1)
    assert again.restart and again.members == (0,)


def test_below_min_nodes_is_a_clean_failure_naming_the_lost_nodes() -> None:
    d = decide(5, [lost((0, 1, 2), (1, 2))], NONE, min_nodes=2)
    assert not d.restart
    assert d.why == (f"not restarting: {LOST2}; nodes 1, 2 lost: 1 of 3 nodes left, fewer than "
                     "--min-nodes 2")
    # without --min-nodes every node is needed, as before
    assert decide(5, [lost((0, 1, 2), (2,))], NONE).why.endswith("a restart needs every node")


def test_a_worker_failure_with_a_node_gone_continues_without_that_node() -> None:
    crash = Attempt(0, 3, "rank 0 on node 0 (h0) exited with status 3", False, NONE, C4,
                    members=(0, 1, 2), lost=(1,))
    d = decide(3, [crash], NONE, min_nodes=2)
    assert d.restart and d.members == (0, 2)
    no_min = decide(3, [crash], NONE)
    assert not no_min.restart and "status 3; node 1 lost; a restart needs every node" in no_min.why


def judges(n: int, max_restarts: int = 3, min_nodes: int = 1) -> list[restart_judge.Restarts]:
    return [restart_judge.Restarts(max_restarts, lambda: C4, NONE, tuple(range(n)), me, min_nodes)
            for me in range(n)]


def test_survivors_of_the_chief_agree_without_talking() -> None:
    """Each survivor decides alone (no chief to ask) and they reach the same
    decision: the same nodes minus the chief, led by the lowest of them."""
    chief_lost = Failure(1, "the chief's launcher", 0, "h0", 1.0, how="was lost")
    nodes = judges(3)[1:]
    decisions = [j.decide(1, chief_lost, frozenset({0})) for j in nodes]
    assert decisions[0] == decisions[1]
    assert decisions[0].restart and decisions[0].members == (1, 2)
    assert decisions[0].generation == 1
    # the next generation: node 1 is its chief (rank 0), node 2 its rank 1
    original = ClusterInfo(("h0", "h1", "h2"), 2, (1, 2, 4), (0,), "test")
    info = generations.membership_info(original, decisions[0].members, "ck-4")
    assert (info.container_addrs, info.container_rank, info.container_slot_counts,
            info.chief_ip, info.latest_checkpoint) == (("h1", "h2"), 1, (2, 4), "h1", "ck-4")


def test_nodes_keep_count_of_restarts_they_followed() -> None:
    """A node that followed the chief's restarts counts them too, so if the
    chief is lost later the survivors still number generations alike (each
    has its own secret) and stop at --max-restarts."""
    chief, node = judges(2, max_restarts=2)
    crash = Failure(3, "rank 1", 1, "h1", 1.0)
    word = chief.decide(3, crash)
    node.decide(3, crash)
    assert node.follow(Decision.from_message(word.to_message())) == word
    chief_lost = Failure(1, "the chief's launcher", 0, "h0", 1.0, how="was lost")
    alone = node.decide(1, chief_lost, frozenset({0}))
    assert alone.restart and alone.generation == 2 and alone.members == (1,)
    assert not node.decide(1, Failure(3, "rank 0", 0, "h1", 1.0)).restart  # 2 of 2 used


def test_a_node_the_others_continue_without_does_not_start_again() -> None:
    _, silent = judges(2)  # the chief lost it (no heartbeat) while it still runs
    d = silent.follow(Decision(True, "restart 1 of 3 ...", resume=C4, generation=1, members=(0,)))
    assert not d.restart
    assert d.why == ("not restarting: the job continues on node 0 without this node (node 1), "
                     "which it lost")


def test_a_node_that_ran_generations_keeps_their_record_when_it_takes_a_later_one() -> None:
    """Issue 35 §0.5: a node superseded by a generation that takes it in
    (``_take``) summarized the generations it had run itself as 'a generation
    this node missed'. Its own record stays; only missed ones are stand-ins."""
    node = judges(3)[1]
    node.decide(3, Failure(3, "rank 0", 0, "h0", 1.0))  # generation 0: it ran it
    node.join_at(3, (0, 1), C4, used=3)  # generations 1, 2 ran without it
    causes = [a.cause for a in node.attempts]
    assert causes[0] == "rank 0 on node 0 (h0) exited with status 3"
    assert causes[1:] == ["a generation this node missed"] * 2
    assert node.used() == 3
    fresh = judges(2)[1]  # a node that ran nothing here rejoins: stand-ins only
    fresh.join_at(2, (0, 1), C4, used=1)
    assert [a.cause for a in fresh.attempts] == ["a generation this node missed", ""]
    assert fresh.used() == 1


def test_a_launcher_that_was_stopped_does_not_call_its_peers_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35 §0.5: a launcher resumed by SIGCONT judged its peers by its
    own frozen time ('was lost (no heartbeat)', 'killed or crashed'); a pass
    of its reader that took half a heartbeat timeout is its own pause."""
    from determined_launch.supervisor import control

    clock = [100.0]
    monkeypatch.setattr(control.time, "monotonic", lambda: clock[0])
    pauses = control._Pauses()
    clock[0] += 0.5
    assert not pauses.tick() and pauses.why("was lost (x)") == "was lost (x)"
    clock[0] += 15.0  # SIGSTOP ... SIGCONT
    assert pauses.tick()
    assert pauses.why("was lost (x)") == ("hung up while this launcher was not running for 15s "
                                          "(stopped or starved): it saw this launcher silent")


def test_a_resumed_chief_reads_that_a_node_lost_it_not_that_it_was_lost() -> None:
    """Issue 35 §0.5: a chief SIGSTOPped long enough for its nodes to decide
    without it reads, once resumed, their buffered reports of its loss. The
    channel stamps the sender's node on them, so the old verdict called the
    chief itself 'the chief's launcher on node 1 (<its own address>) was lost'.
    It is node 1 that this chief lost."""
    from determined_launch.supervisor import verdict as v

    verdict = v.Verdict(v.Settings(
        role=v.Role.CHIEF, node=0, hosts=("h0", "h1", "h2"), roles=("worker",),
        names=("rank 0",), preempt_signals=(), preempt_grace=30.0, kill_after=5.0,
        connect_timeout=300.0), now=0.0)
    report = Failure(1, "the chief's launcher", 0, "h0", 1000.0,
                     how="was lost (no heartbeat for 10s)").to_message()
    verdict.handle(v.PeerMessage(v.message(v.Kind.FAILED, **{**report, "node": 1})), 1.0, 1001.0)
    verdict.tick(10.0, 1010.0)
    assert verdict.cause is not None
    assert verdict.cause.describe() == ("the launcher on node 1 (h1) lost sight of this chief "
                                        "(no heartbeat for 10s)")
    j = restart_judge.Restarts(2, lambda: C4, NONE, (0, 1, 2), 0, min_nodes=1)
    assert j.decide(1, verdict.cause).members == (0, 2)  # node 1 goes on without this chief


def test_members_cross_the_wire_and_bind_the_secret() -> None:
    d = decide(2, [lost((0, 1, 2), (2,))], NONE, min_nodes=2)
    assert Decision.from_message(d.to_message()) == d
    assert not Decision.from_message({**d.to_message(), "members": ["0"]}).restart
    two_groups = {generations.generation_secret("s" * 32, 1, m) for m in ((0, 1), (1, 2))}
    assert len(two_groups) == 2


def test_messages_name_nodes_by_their_original_rank() -> None:
    """After node 0 was lost, generation 1 runs original nodes 1 and 2 as its
    ranks 0 and 1; its messages still say node 2 for node 2."""
    from determined_launch.supervisor import verdict as v

    verdict = v.Verdict(v.Settings(
        role=v.Role.CHIEF, node=0, hosts=("h1", "h2"), roles=("worker",), names=("rank 0",),
        preempt_signals=(), preempt_grace=30.0, kill_after=5.0, connect_timeout=300.0,
        ids=(1, 2)), now=0.0)
    verdict.handle(v.PeerMessage(v.message(v.Kind.LOST, node=1, why="was lost (test)")),
                   1.0, 1001.0)
    verdict.tick(10.0, 1010.0)  # the failure window closes
    assert verdict.cause is not None
    assert verdict.cause.describe() == "the launcher on node 2 (h2) was lost (test)"
    crash = verdict._rank_failure(v.RankExited(0, 3, 1000.0))
    assert crash.describe() == "rank 0 on node 1 (h1) exited with status 3"
    # the chief's record maps it back to the same node
    j = restart_judge.Restarts(2, lambda: C4, NONE, (1, 2), 1, min_nodes=1)
    assert j.decide(1, verdict.cause).members == (1,)


def test_each_generation_has_its_own_ports() -> None:
    """Issue 35 §0.3: every generation used C10D_PORT..+2, so a SIGSTOPped
    chief on a host the next chief shares kept the control port and the
    next chief could not lead (it called itself lost)."""
    ports = [generations.generation_ports(29400, g) for g in range(generations.PORT_CYCLE)]
    assert ports[0] == (29400, 29401, 29402)
    flat = [p for three in ports for p in three]
    assert len(set(flat)) == len(flat) and 29403 not in flat  # +3: the gang channel
    assert generations.generation_ports(29400, generations.PORT_CYCLE) == ports[0]
    assert generations.generation_ports(65533, 1) == (65529, 65530, 65531)


def _no_longer_subreaper() -> None:
    """An in-process Supervisor makes pytest's process a child subreaper; undo it, or the
    orphans of later tests' SIGKILLed launchers are adopted here (the fault matrix's
    node-SIGKILL row then saw its worker left behind when it ran after these tests)."""
    from determined_launch.supervisor import processes

    prctl = processes._libc_prctl()
    if prctl is not None:
        prctl(processes._PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_a_frozen_chief_holds_only_its_own_generations_port(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stopped process holds generation 0's control port (the frozen chief):
    generation 1's chief on the same host listens on its own; one that finds
    its port taken says by whom and does not call itself lost."""
    import shutil
    import subprocess

    from determined_launch.backends.plan import LaunchPlan, ProcessSpec
    from determined_launch.launch.runtime import make_runtime
    from determined_launch.supervisor import Supervisor, SupervisorConfig
    from determined_launch.supervisor.control import ChiefLink, ControlError

    base = free_port_block(12)
    env = {"C10D_PORT": str(base), "DET_DIST_SECRET": "u" * 32}
    info = ClusterInfo(("127.0.0.1", "127.0.0.1"), 0, (1, 1), (0,), "test")
    gen0, gen1 = (make_runtime(info, env, generation=g) for g in (0, 1))
    shutil.rmtree(gen0.job_dir)
    hold = ("import os, signal, socket, sys\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
            "print('held', flush=True); os.kill(os.getpid(), signal.SIGSTOP)")
    frozen = [subprocess.Popen([sys.executable, "-c", hold, str(p)], stdout=subprocess.PIPE,
                               text=True) for p in (gen0.control_port, gen1.control_port + 4)]
    try:
        for f in frozen:
            assert f.stdout is not None and f.stdout.readline() == "held\n"
        assert gen1.control_port != gen0.control_port
        ChiefLink("127.0.0.1", gen1.control_port, 2, "u" * 32).close()  # old code: in use
        with pytest.raises(ControlError, match=rf"\(held by pid {frozen[0].pid} "
                                               rf"\(python[0-9.]*, stopped\)\)"):
            ChiefLink("127.0.0.1", gen0.control_port, 2, "u" * 32)
        # generation 2's chief finds its port taken (by the second frozen process)
        gen2 = make_runtime(info, env, generation=2, members=(0, 1))
        judge = restart_judge.Restarts(3, lambda: C4, NONE, (0, 1), 0, 1)
        plan = LaunchPlan((ProcessSpec((sys.executable, "-c", "pass"), "cmd"),))
        sup = Supervisor(plan, info, gen2, SupervisorConfig(connect_timeout=0.3),
                         restarts=judge, members=(0, 1))
        try:
            assert sup.run() == 1
        finally:
            shutil.rmtree(gen2.job_dir, ignore_errors=True)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, sup.deferred)
            _no_longer_subreaper()
        why = sup.decision.why
        assert not sup.decision.restart
        assert why.startswith("not restarting: this node cannot lead the job's generation here: "
                              f"cannot listen on 127.0.0.1:{gen2.control_port}")
        assert f"(held by pid {frozen[1].pid} (python" in why and "lost" not in why
        assert why in capsys.readouterr().err
    finally:
        shutil.rmtree(gen1.job_dir, ignore_errors=True)
        for f in frozen:
            f.kill()
            f.wait()


@pytest.mark.parametrize("min_nodes", [1, None])
def test_a_chief_that_never_answers_is_lost_too(min_nodes: int | None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The survivor chosen as the next chief died too: its nodes never reach
    it, start no worker, and decide alone as for a lost chief."""
    import shutil

    from determined_launch.backends.plan import LaunchPlan, ProcessSpec
    from determined_launch.launch.runtime import make_runtime
    from determined_launch.supervisor import Supervisor, SupervisorConfig

    info = ClusterInfo(("127.0.0.1", "127.0.0.1"), 1, (1, 1), (0,), "test")
    runtime = make_runtime(info, {"C10D_PORT": str(free_port_block(8)),
                                  "DET_DIST_SECRET": "u" * 32}, generation=1, members=(1, 2))
    judge = restart_judge.Restarts(3, lambda: C4, NONE, (1, 2), 2, min_nodes)
    plan = LaunchPlan((ProcessSpec((sys.executable, "-c", "raise SystemExit(9)"), "cmd"),))
    sup = Supervisor(plan, info, runtime, SupervisorConfig(connect_timeout=0.3),
                     restarts=judge, members=(1, 2))
    try:
        assert sup.run() == 1
    finally:
        shutil.rmtree(runtime.job_dir, ignore_errors=True)
        # a restart keeps signals blocked for the next generation: there is none here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, sup.deferred)
        _no_longer_subreaper()
    why = sup.decision.why
    assert "the chief's launcher on node 1 (127.0.0.1) could not be reached within its " \
           "connect timeout (could not reach the chief's launcher at 127.0.0.1:" in why
    if min_nodes:
        assert sup.decision.restart and sup.decision.members == (2,)
        assert "continuing without node 1 on node 2" in why
    else:
        assert not sup.decision.restart and why.endswith(
            "a restart needs every node; job failed (exit status 1)")
    assert why in capsys.readouterr().err


def test_min_nodes_option_and_its_checks() -> None:
    assert config.resolve({})["min_nodes"] is None
    assert config.resolve({"DET_LAUNCH_MIN_NODES": "2"})["min_nodes"] == 2
    with pytest.raises(LaunchError, match=r"^environment variable DET_LAUNCH_MIN_NODES: expected"):
        config.resolve({"DET_LAUNCH_MIN_NODES": "0"})
    info = ClusterInfo(("h0", "h1"), 0, (1, 1), (0,), "test")
    restart_judge.check_min_nodes(None, 0, info)
    restart_judge.check_min_nodes(2, 1, info)
    with pytest.raises(LaunchError, match=r"^--min-nodes 1 \(DET_LAUNCH_MIN_NODES\) needs "
                                          r"--max-restarts N >= 1"):
        restart_judge.check_min_nodes(1, 0, info)
    with pytest.raises(LaunchError, match=r"is more than this job's 2 nodes$"):
        restart_judge.check_min_nodes(3, 1, info)


def test_a_rejoin_scales_back_up_without_using_a_restart() -> None:
    from determined_launch.errors import EXIT_PREEMPTED

    lose = lost((0, 1, 2), (2,))
    made_room = Attempt(1, EXIT_PREEMPTED, "", False, C4, C4, members=(0, 1), joining=(2,))
    d = decide(1, [lose, made_room], NONE, min_nodes=2)
    assert d.restart and d.members == (0, 1, 2) and d.generation == 2 and d.resume == C4
    assert d.why == ("node 2 rejoins: continuing on nodes 0, 1, 2 (generation 2); resuming "
                     "from checkpoint ck-4, steps_completed 4")
    # the one restart was used by the loss; the rejoin took none, and the history says one
    crash = Attempt(2, 3, "rank 0 on node 0 (h0) exited with status 3", False, C4, C4,
                    members=(0, 1, 2))
    final = decide(1, [lose, made_room, crash], NONE, min_nodes=2)
    assert final.why == "not restarting: all 1 restart used"
    assert final.history == f" after 1 restart (1: {LOST2})"
    # a preemption with nobody joining ends the job, as before
    alone = Attempt(1, EXIT_PREEMPTED, "", False, C4, C4, members=(0, 1))
    assert not decide(1, [lose, alone], NONE, min_nodes=2).restart


def test_every_node_keeps_the_rejoin_record() -> None:
    """The chief decides the rejoin; node 1 follows and counts it as no restart;
    the rejoining node takes the record from the claim."""
    from determined_launch.errors import EXIT_PREEMPTED

    chief, node, back = judges(3, max_restarts=1, min_nodes=2)
    lost2 = Failure(1, "the launcher", 2, "h2", 1.0, how="was lost")
    for j in (chief, node):
        j.decide(1, lost2, frozenset({2}) if j is chief else frozenset())
    word = chief.decide(EXIT_PREEMPTED, None, joining=(2,))
    node.decide(EXIT_PREEMPTED, None)
    assert node.follow(word) == word and word.members == (0, 1, 2)
    assert chief.used() == node.used() == 1
    back.join_at(2, (0, 1, 2), C4, used=1)
    assert back.used() == 1 and back.members == (0, 1, 2) and len(back.attempts) == 2
    crash = Failure(3, "rank 0", 0, "h0", 1.0)
    assert {j.decide(3, crash).why for j in (chief, node, back)} == {
        "not restarting: all 1 restart used"}


# ------------------------------------------------------------------ real jobs
WORKER = [sys.executable, str(WORKERS / "elastic_worker.py")]
STEPS, CKPT_EVERY = 12, 4


def model():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(WORKERS))
    try:
        import elastic_model
    finally:
        sys.path.remove(str(WORKERS))
    return elastic_model


def reference(skip: int = -1, repeat: int = -1, steps: int = STEPS) -> float:
    """The uninterrupted one-process run's weight (``skip``/``repeat``: with that
    step's batch left out or used twice)."""
    m = model()
    w = 0.0
    for step in range(steps):
        batch = sum(m.sample(i) for i in range(step * m.GLOBAL_BATCH, (step + 1) * m.GLOBAL_BATCH))
        for _ in range(0 if step == skip else 2 if step == repeat else 1):
            w = m.update(w, step, batch)
    return w


def test_the_model_notices_a_skipped_or_repeated_batch() -> None:
    moved = [abs(reference(skip=s) - reference()) for s in range(STEPS)]
    moved += [abs(reference(repeat=s) - reference()) for s in range(STEPS)]
    assert min(moved) >= 3e-4


def node_command(tmp_path: Path, rank: int, n: int, port: int, flags: tuple[str, ...],
                 **extra: str) -> tuple[list[str], dict[str, str]]:
    """``det-launch FLAGS exec -- elastic_worker`` as simulated node ``rank`` of ``n``."""
    info = write_cluster_info(tmp_path / f"node{rank}.json",
                              container_addrs=["127.0.0.1"] * n, container_rank=rank,
                              container_slot_counts=[1] * n)
    env = base_env(**{
        "DET_CLUSTER_INFO_FILE": str(info), "C10D_PORT": str(port),
        "DET_DIST_SECRET": "m" * 32, "DET_KILL_AFTER": "3", "NODE_ID": str(rank),
        "DET_RUN_DIR": str(tmp_path / "run"), "STEPS": str(STEPS),
        "CKPT_EVERY": str(CKPT_EVERY), "PAUSE_FILE": str(tmp_path / "paused"),
        "PAUSE_AT": "6", "DET_LAUNCH_CONNECT_TIMEOUT": "20", **extra})
    return [sys.executable, "-m", "determined_launch.cli", *flags, "exec", "--", *WORKER], env


def start_nodes(tmp_path: Path, n: int, launches: list[Launch], flags: tuple[str, ...],
                port: int = 0, **extra: str) -> list[Launch]:
    """``n`` simulated nodes on loopback, started and registered for cleanup
    (the ports of generations 0-2 free: each generation has its own three)."""
    port = port or free_port_block(12)
    nodes = [Launch(*node_command(tmp_path, rank, n, port, flags, **extra)) for rank in range(n)]
    launches.extend(nodes)
    return nodes


def kill_when_paused(tmp_path: Path, node: Launch) -> None:
    deadline = time.monotonic() + 60
    while not (tmp_path / "paused").exists():
        assert time.monotonic() < deadline and node.proc.poll() is None, "no pause"
        time.sleep(0.05)
    node.proc.kill()  # its host died: no goodbye (its worker dies with it)
    node.wait(10)


def final_w(out: str) -> float:
    found = re.findall(r"final w=(\S+)", out)
    assert len(found) == 1, out
    return float(found[0])


@pytest.mark.slow
def test_losing_the_chief_continues_on_the_others_with_the_exact_weight(
        tmp_path: Path, launches: list[Launch]) -> None:
    """3 nodes, --min-nodes 2: the chief's launcher is killed at step 6
    (checkpoint at 4); nodes 1 and 2 continue from step 4, led by node 1 (the
    lowest survivor, which each decided alone), and end with the uninterrupted
    run's weight."""
    nodes = start_nodes(tmp_path, 3, launches, ("--max-restarts", "2", "--min-nodes", "2"),
                        PAUSE_NODE="0")
    kill_when_paused(tmp_path, nodes[0])
    survivors = nodes[1:]
    for node in survivors:
        assert node.wait(60) == 0, node.stdout + node.stderr
    leader = survivors[0]  # the lowest surviving node: the new chief (rank 0)
    assert math.isclose(final_w(leader.stdout), reference(), abs_tol=1e-9), leader.stdout
    assert "node=1 rank=0 size=2 start=4" in leader.stdout
    for node in survivors:
        assert re.search(r"restart 1 of 2 after the chief's launcher on node 0 .*continuing "
                         r"without node 0 on nodes 1, 2", node.stderr), node.stderr
        assert "job succeeded on 2 nodes (exit status 0) after 1 restart" in node.stderr
    claim = Claims(tmp_path / "run", "m" * 32, 3).load(1)  # signed with the job's key
    assert claim is not None and claim.members == (1, 2)  # claimed by its chief
    for node in nodes:
        assert node.leftovers() == []


@pytest.mark.slow
def test_a_lost_node_that_comes_back_rejoins_with_the_exact_weight(
        tmp_path: Path, launches: list[Launch]) -> None:
    """3 nodes, --min-nodes 2: node 2's launcher is killed at step 6; nodes 0
    and 1 continue from the checkpoint at step 4; node 2's launcher is started
    again with the same command, asks to rejoin, the chief preempts (the
    workers checkpoint) and the three continue together, ending with the
    uninterrupted run's weight."""
    steps = 16
    extra = {"PAUSE_NODE": "2", "STEPS": str(steps), "HOLD_AT": "10"}
    flags = ("--max-restarts", "2", "--min-nodes", "2")
    port = free_port_block(12)
    nodes = start_nodes(tmp_path, 3, launches, flags, port, **extra)
    kill_when_paused(tmp_path, nodes[2])
    wait_for_file(tmp_path / "run" / "generations" / "1.json", 60, "generation 1's claim")
    again = Launch(*node_command(tmp_path, 2, 3, port, flags, **extra))  # the same command
    launches.append(again)
    for node in (nodes[0], nodes[1], again):
        assert node.wait(90) == 0, node.stdout + node.stderr
    assert math.isclose(final_w(nodes[0].stdout), reference(steps=steps), abs_tol=1e-9), \
        nodes[0].stdout
    assert "node=0 rank=0 size=2 start=4" in nodes[0].stdout  # continued without node 2
    assert "node=2 rank=2 size=3 start=10" in again.stdout, again.stdout  # the boundary
    assert "asking to rejoin at its next checkpoint" in again.stderr
    assert re.search(r"node 2 rejoins: continuing on nodes 0, 1, 2 \(generation 2\)",
                     nodes[0].stderr), nodes[0].stderr
    assert "job succeeded on 3 nodes (exit status 0) after 1 restart" in nodes[0].stderr
    claim = Claims(tmp_path / "run", "m" * 32, 3).load(2)
    assert claim is not None and claim.members == (0, 1, 2) and claim.restarts == 1
    for node in (*nodes, again):
        assert node.leftovers() == []


@pytest.mark.slow
def test_below_min_nodes_the_job_fails_naming_the_lost_node(tmp_path: Path,
                                                             launches: list[Launch]) -> None:
    started = tmp_path / "started"
    started.mkdir()
    nodes = exec_on_two_nodes(
        tmp_path, [sys.executable, "-c", "import os, time; "
                   f"open(os.path.join({str(started)!r}, str(os.getpid())), 'w'); time.sleep(60)"],
        launches, launcher_flags=("--max-restarts", "2", "--min-nodes", "2"))
    deadline = time.monotonic() + 30
    while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # both nodes' commands run
    nodes[1].proc.kill()
    assert nodes[0].wait(30) == 1, nodes[0].stderr
    assert ("not restarting: the launcher on node 1 (127.0.0.1) was lost (its connection closed: "
            "the launcher was killed or crashed); node 1 lost: 1 of 2 nodes left, fewer than "
            "--min-nodes 2") in nodes[0].stderr, nodes[0].stderr
    assert "det-launch: restart" not in nodes[0].stderr
    assert nodes[0].leftovers() == []


def test_a_run_directory_anyone_may_write_is_refused_in_one_line(tmp_path: Path) -> None:
    """Issue 34 §8: ``--min-nodes`` keeps its claims in the run directory;
    one that everyone may write is refused before anything starts."""
    import subprocess

    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    argv, env = node_command(tmp_path, 0, 2, free_port_block(12),
                             ("--max-restarts", "1", "--min-nodes", "1"))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"det-launch: error: run directory {run} is writable by everyone "
                           f"(mode 0777): --min-nodes keeps its nodes' claims there; share it "
                           f"with the job's own group at most (chmod o-w,g-w or chgrp) or set "
                           f"DET_RUN_DIR elsewhere\n")
    assert not (run / "generations").exists()
