"""``--max-restarts``: the pure restart policy, and real jobs that restart
(real torchrun, gloo, processes; one node and two simulated nodes)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from determined_launch.errors import EXIT_PREEMPTED
from determined_launch.launch import config, generations, restart_judge
from determined_launch.supervisor import handoff
from determined_launch.supervisor.control import ChiefLink, NodeLink
from determined_launch.supervisor.events import Failure
from determined_launch.supervisor.restarts import Attempt, Decision, Progress, decide
from tests.conftest import (
    WORKERS,
    Launch,
    base_env,
    exec_on_two_nodes,
    free_port_block,
    write_cluster_info,
)

WORKER = [sys.executable, str(WORKERS / "restart_worker.py")]
NONE = Progress()
C4 = Progress("ck-4", 4)
C8 = Progress("ck-8", 8)


def attempt(gen: int, status: int = 3, start: Progress = NONE, end: Progress = NONE,
            cause: str = "rank 1 on node 0 (h) exited with status 3",
            interrupted: bool = False) -> Attempt:
    return Attempt(gen, status, cause, interrupted, start, end)


# ------------------------------------------------------------------ the pure policy
def test_a_failure_restarts_from_the_newest_checkpoint() -> None:
    d = decide(2, [attempt(0, end=C4)], NONE)
    assert d.restart and d.resume == C4 and d.generation == 1
    assert d.why == ("restart 1 of 2 after rank 1 on node 0 (h) exited with status 3 "
                     "(generation 0); resuming from checkpoint ck-4, steps_completed 4")


def test_without_a_checkpoint_it_restarts_from_where_the_job_started() -> None:
    assert decide(1, [attempt(0)], NONE).resume == NONE
    initial = Progress("given")
    assert decide(1, [attempt(0, start=initial, end=initial)], initial).resume == initial


@pytest.mark.parametrize("status,interrupted", [(0, False), (EXIT_PREEMPTED, False),
                                                (130, True), (143, True)])
def test_success_preemption_and_interruption_are_final(status: int, interrupted: bool) -> None:
    cause = "the launcher on node 0 (h) was interrupted by SIGINT" if interrupted else ""
    d = decide(5, [attempt(0, status, cause=cause, interrupted=interrupted, end=C4)], NONE)
    assert not d.restart
    assert ("stopped on request" in d.why) == interrupted


def test_a_worker_exiting_75_on_its_own_is_a_failure() -> None:
    # 75 without the workers' acknowledgement: the verdict names a cause
    assert decide(1, [attempt(0, EXIT_PREEMPTED, end=C4)], NONE).restart


def test_max_restarts_zero_says_nothing() -> None:
    assert decide(0, [attempt(0, end=C4)], NONE) == Decision(False)


def test_restarts_stop_when_used_up() -> None:
    attempts = [attempt(0, end=C4), attempt(1, start=C4, end=C8)]
    d = decide(1, attempts, NONE)
    assert not d.restart and d.why == "not restarting: all 1 restart used"
    assert d.history == " after 1 restart (1: rank 1 on node 0 (h) exited with status 3)"
    assert decide(2, attempts, NONE).restart  # progress made: the second restart is allowed


def test_the_same_failure_at_the_same_point_stops_early() -> None:
    attempts = [attempt(0, end=C4), attempt(1, start=C4, end=C4)]
    d = decide(5, attempts, NONE)
    assert not d.restart and d.repeated
    assert "the same failure (exit status 3) repeated at the same point (checkpoint ck-4, " \
           "steps_completed 4)" in d.why


def test_two_deaths_by_signal_at_the_same_point_are_not_a_repeat() -> None:
    """Two unrelated SIGKILLs (OOM killer, an operator) within one checkpoint
    interval: a signal says nothing about determinism, so restarts go on until used up."""
    for status in (137, 139, 143):
        attempts = [attempt(0, status, end=C4), attempt(1, status, start=C4, end=C4)]
        d = decide(5, attempts, NONE)
        assert d.restart and not d.repeated, status
    attempts = [attempt(0, 137, end=C4), attempt(1, 137, start=C4, end=C4)]
    assert not decide(1, attempts, NONE).restart  # the budget still bounds them


def test_a_different_status_or_a_new_checkpoint_is_not_a_repeat() -> None:
    assert decide(5, [attempt(0, end=C4), attempt(1, 134, start=C4, end=C4)], NONE).restart
    assert decide(5, [attempt(0, end=C4), attempt(1, start=C4, end=C8)], NONE).restart
    # no checkpoint ever: the same status twice from scratch is a repeat too
    assert decide(5, [attempt(0), attempt(1)], NONE).repeated


def test_a_lost_node_is_not_restarted() -> None:
    lost = Attempt(0, 1, "the launcher on node 1 (h1) was lost (no heartbeat for 10s)", False,
                   NONE, C4, node_lost=True)
    d = decide(3, [lost], NONE)
    assert not d.restart and d.why == ("not restarting: the launcher on node 1 (h1) was lost "
                                       "(no heartbeat for 10s); a restart needs every node")
    r = restart_judge.Restarts(3, lambda: C4, initial=NONE)
    assert not r.decide(1, Failure(1, "the launcher", 1, "h1", 1.0, how="was lost")).restart


def test_decision_crosses_the_wire_and_a_malformed_one_means_no_restart() -> None:
    d = decide(3, [attempt(0, end=C4)], NONE)
    assert Decision.from_message(d.to_message()) == d
    bad = Decision.from_message({"restart": "yes", "generation": 1})
    assert not bad.restart and "malformed" in bad.why


def test_restarts_count_only_this_jobs_checkpoints() -> None:
    """--fresh with an old checkpoint in the run directory: a failure before
    the job's own first checkpoint restarts fresh, not from the old one."""
    newest = [Progress("old", 100)]
    r = restart_judge.Restarts(3, lambda: newest[0], initial=NONE)
    fail = Failure(3, "rank 1", 0, "h", 1.0)
    d = r.decide(3, fail)
    assert d.restart and d.resume == NONE
    newest[0] = C4
    d = r.decide(3, fail)
    assert d.restart and d.resume == C4
    d = r.decide(3, fail)  # resumed from ck-4, failed again without a new checkpoint
    assert d.repeated and d.history.startswith(" after 2 restarts (1: rank 1 on node 0")


def test_each_generation_has_its_own_secret() -> None:
    secrets = {generations.generation_secret("s" * 32, g) for g in range(4)}
    assert len(secrets) == 4 and "s" * 32 in secrets
    assert generations.generation_secret(None, 3) is None


def test_bad_max_restarts_is_one_line() -> None:
    with pytest.raises(Exception, match=r"DET_LAUNCH_MAX_RESTARTS: expected an integer"):
        config.resolve({"DET_LAUNCH_MAX_RESTARTS": "-1"})
    assert config.resolve({})["max_restarts"] == 0
    assert config.resolve({}, {"max_restarts": "4"})["max_restarts"] == 4


def test_experiments_keep_their_configs_max_restarts() -> None:
    from determined_launch.errors import LaunchError
    from determined_launch.experiment import cli as ecli
    from determined_launch.experiment import command

    for flag, var in (("--max-restarts", "DET_LAUNCH_MAX_RESTARTS"),
                      ("--min-nodes", "DET_LAUNCH_MIN_NODES")):
        ns = ecli.parser().parse_args(["exp.yaml", flag, "2"])
        with pytest.raises(LaunchError, match=f"^{flag} restarts one job; det-launch "
                                              "experiment restarts each trial by its config's"):
            command.refuse_trial_identity(ns)
        assert flag not in command.trial_flags(ns)
        assert var in command.trial_identity_env()  # kept from the trials


# ------------------------------------------- the decision crosses real control links
def test_the_chief_hands_its_decision_over_and_waits_for_every_node() -> None:
    port = free_port_block(1)
    chief = ChiefLink("127.0.0.1", port, num_nodes=2, secret="k" * 32)
    node = NodeLink("127.0.0.1", port, 1, "k" * 32, connect_timeout=5, num_nodes=2)
    decision = decide(1, [attempt(0, end=C4)], NONE)
    try:
        deadline = time.monotonic() + 5
        while not chief.connected_nodes and time.monotonic() < deadline:
            time.sleep(0.02)
        got: list[Decision] = []
        waiter = threading.Thread(target=lambda: got.append(handoff.await_chief(node, None, 5)))
        waiter.start()
        closer = threading.Timer(0.3, lambda: (waiter.join(), node.close()))
        closer.start()  # the node hangs up once its (here: no) workers are gone
        assert handoff.announce(chief, decision, timeout=5) == decision
        closer.join()
        assert got == [decision]
        # the old generation's listener is gone: a new one binds the same port at once
        ChiefLink("127.0.0.1", port, num_nodes=2, secret="k" * 32).close()
    finally:
        node.close()
        chief.close()


def test_a_node_that_does_not_hang_up_stops_the_restart() -> None:
    port = free_port_block(1)
    chief = ChiefLink("127.0.0.1", port, num_nodes=2, secret="k" * 32)
    node = NodeLink("127.0.0.1", port, 1, "k" * 32, connect_timeout=5, num_nodes=2)
    try:
        deadline = time.monotonic() + 5
        while not chief.connected_nodes and time.monotonic() < deadline:
            time.sleep(0.02)
        d = handoff.announce(chief, decide(1, [attempt(0, end=C4)], NONE), timeout=0.5)
        assert not d.restart and d.why == "not restarting: node 1 did not stop its workers " \
                                          "within 0.5s"
        time.sleep(0.2)
        assert handoff.await_chief(node, None, 5) == d  # the stuck node reads the last word
        chief.close()  # and a node whose chief vanishes before deciding does not restart
        assert handoff.await_chief(node, None, 5) is None
    finally:
        node.close()
        chief.close()


DEFERRED_SIGNAL = """
import os, shutil, signal, sys, time
from determined_launch.backends.plan import LaunchPlan, ProcessSpec
from determined_launch.cluster.info import ClusterInfo
from determined_launch.launch.launcher import make_runtime
from determined_launch.supervisor import Supervisor, SupervisorConfig
from determined_launch.supervisor.restarts import Decision

info = ClusterInfo(("127.0.0.1",), 0, (1,), (0,), "test")
class Judge:
    def __init__(self, restart):
        self.restart = restart
    def decide(self, status, cause, lost=frozenset(), joining=()):
        if self.restart:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the generation ends
        return Decision(self.restart, "restart 1 of 1 (test)", generation=1)
    def follow(self, decision):
        return decision
def plan(code):
    return LaunchPlan((ProcessSpec((sys.executable, "-c", code), "the command"),))
config = SupervisorConfig(kill_after=2)
runtimes = [make_runtime(info, {}), make_runtime(info, {}, generation=1)]
first = Supervisor(plan("raise SystemExit(3)"), info, runtimes[0], config, restarts=Judge(True))
print("first", first.run(), first.decision.restart, flush=True)
second = Supervisor(plan("import time; time.sleep(60)"), info, runtimes[1], config,
                    restarts=Judge(False), deferred=first.deferred)
print("second", second.run(), flush=True)
for r in runtimes:
    shutil.rmtree(r.job_dir, ignore_errors=True)
"""


def test_a_signal_while_a_generation_ends_reaches_the_next_one() -> None:
    """A TERM that lands between two generations is neither lost (the next one
    would train on) nor fatal to the launcher: the next generation gets it."""
    out = subprocess.run([sys.executable, "-c", DEFERRED_SIGNAL], env=base_env(),
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.splitlines() == ["first 3 True", "second 143"], out.stdout + out.stderr
    assert "job stopped: the launcher on node 0 (127.0.0.1) received SIGTERM" in out.stderr


# ------------------------------------------------------------------ real jobs
STEPS, CKPT_EVERY, RANKS = 16, 4, 2


def reference(skip: int = -1, ranks: int = RANKS) -> float:
    """The uninterrupted run's weight (``skip``: with that step left out)."""
    sys.path.insert(0, str(WORKERS))
    try:
        import restart_model as rw
    finally:
        sys.path.remove(str(WORKERS))
    w = 0.0
    for step in range(STEPS):
        if step != skip:
            w = rw.update(w, step, sum(rw.sample(step, r) for r in range(ranks)))
    return w


def final_w(out: str) -> float:
    found = re.findall(r"final w=(\S+)", out)
    assert len(found) == 1, out
    return float(found[0])


def test_the_model_notices_a_skipped_step() -> None:
    # so that "within 1e-5 of the uninterrupted run" proves no step was lost or repeated
    assert min(abs(reference(s) - reference()) for s in range(STEPS)) >= 3e-4


def crash_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return base_env(**{"DET_RUN_DIR": str(tmp_path / "run"), "CRASH_RANK": "1", "CRASH_AT": "6",
                       "CRASH_MARKER": str(tmp_path / "crashed"), "DET_KILL_AFTER": "3",
                       "STEPS": str(STEPS), "CKPT_EVERY": str(CKPT_EVERY), **extra})


@pytest.mark.slow
def test_a_crash_that_repeats_at_the_same_step_stops_early(tmp_path: Path,
                                                           launches: list[Launch]) -> None:
    # one process without torch (exec runs the command once per node): restarts are not
    # torch's; the variable, not the flag, asks for them
    launch = Launch([sys.executable, "-m", "determined_launch.cli", "exec", "--", *WORKER],
                    crash_env(tmp_path, CRASH_RANK="0", CRASH_ALWAYS="1",
                              DET_LAUNCH_MAX_RESTARTS="5"))
    launches.append(launch)
    assert launch.wait(60) == 3, launch.stderr
    assert launch.stdout.count("crashing at step 6") == 2, launch.stdout
    assert launch.stderr.count("det-launch: restart ") == 1, launch.stderr
    assert re.search(r"not restarting: the same failure \(exit status 3\) repeated at the same "
                     r"point \(checkpoint \S+, steps_completed 4\)", launch.stderr), launch.stderr
    assert re.search(r"job failed: the command on node 0 .* exited with status 3 first; exit "
                     r"status 3 after 1 restart", launch.stderr), launch.stderr
    assert launch.leftovers() == []


@pytest.mark.slow
def test_a_crash_on_node_1_restarts_node_0_too(tmp_path: Path, launches: list[Launch]) -> None:
    port = free_port_block()
    for rank in (0, 1):
        info = write_cluster_info(tmp_path / f"node{rank}.json",
                                  container_addrs=["127.0.0.1", "127.0.0.1"],
                                  container_rank=rank, container_slot_counts=[1, 1])
        env = crash_env(tmp_path, DET_CLUSTER_INFO_FILE=str(info), C10D_PORT=str(port),
                        DET_DIST_SECRET="r" * 32)
        launches.append(Launch([sys.executable, "-m", "determined_launch.cli",
                                "--max-restarts", "1", "torch", "--", *WORKER], env))
    chief, node1 = launches
    assert node1.wait(120) == 0, node1.stderr
    assert chief.wait(30) == 0, chief.stderr
    assert math.isclose(final_w(chief.stdout), reference(), abs_tol=1e-5)
    for launch in (chief, node1):
        assert "det-launch: restart 1 of 1 after rank 1 on node 1" in launch.stderr, launch.stderr
        assert "job succeeded on 2 nodes (exit status 0) after 1 restart" in launch.stderr
        assert launch.leftovers() == []
    assert "rank=0 generation start=4" in chief.stdout  # node 0's rank restarted too


@pytest.mark.slow
@pytest.mark.parametrize("lost", [0, 1])
def test_a_lost_node_ends_the_job_on_the_others(tmp_path: Path, launches: list[Launch],
                                                lost: int) -> None:
    started = tmp_path / "started"
    started.mkdir()
    nodes = exec_on_two_nodes(
        tmp_path, [sys.executable, "-c", "import os, time; "
                   f"open(os.path.join({str(started)!r}, str(os.getpid())), 'w'); time.sleep(60)"],
        launches, launcher_flags=("--max-restarts", "2"))
    deadline = time.monotonic() + 30
    while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # both nodes' commands run
    nodes[lost].proc.kill()  # its host died: no goodbye
    survivor = nodes[1 - lost]
    assert survivor.wait(30) == 1, survivor.stderr
    who = "the chief's launcher on node 0" if lost == 0 else "the launcher on node 1"
    why = (f"not restarting: {who} (127.0.0.1) was lost (its connection closed: the launcher "
           "was killed or crashed); a restart needs every node")
    assert why in survivor.stderr, survivor.stderr
    assert "det-launch: restart" not in survivor.stderr
    assert survivor.leftovers() == []
