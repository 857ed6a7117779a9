"""The supervisor's verdict, one event order at a time (pure: no processes)."""

from __future__ import annotations

import itertools
import signal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from determined_launch.supervisor import verdict as v

TERM, KILL, INT, USR1 = signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGUSR1


def make(role: v.Role = v.Role.SINGLE, node: int = 0, nodes: int = 1,
         roles: tuple[str, ...] = ("worker",), kill_after: float = 5.0) -> v.Verdict:
    return v.Verdict(
        v.Settings(
            role=role,
            node=node,
            hosts=tuple(f"h{i}" for i in range(nodes)),
            roles=roles,
            names=tuple(f"proc{i}" for i in range(len(roles))),
            preempt_signals=(TERM, USR1),
            preempt_grace=30.0,
            kill_after=kill_after,
            connect_timeout=300.0,
        ),
        now=0.0,
    )


class Clock:
    """Feeds events with a monotonic and a wall clock that move together."""

    def __init__(self, verdict: v.Verdict) -> None:
        self.v = verdict
        self.now = 0.0
        self.actions: list[v.Action] = []

    def at(self, t: float) -> Clock:
        self.now = t
        self.actions += self.v.tick(t, 1000.0 + t)
        return self

    def send(self, event: v.Event) -> list[v.Action]:
        out = self.v.handle(event, self.now, 1000.0 + self.now)
        self.actions += out
        return out


def test_sigint_stops_with_130_and_waits_for_every_process() -> None:
    verdict = make(roles=("worker", "worker"))
    c = Clock(verdict).at(1.0)
    out = c.send(v.SignalReceived(INT))
    assert v.SignalGroups(INT) in out and v.SignalAll(TERM) in out
    # The workers die of what we sent: not failures.
    c.at(1.2).send(v.RankExited(0, 130, 1001.2))
    c.send(v.ProcessExited(0, 130, 1001.2))
    assert not verdict.finished  # process 1 is still alive
    c.send(v.ProcessExited(1, 143, 1001.3))
    assert verdict.finished and verdict.result == 130
    assert "interrupted by SIGINT" in verdict.summary()
    assert verdict.summary().endswith("exit status 130")


def test_sigterm_without_a_preemption_listener_stops_at_once_with_143() -> None:
    verdict = make()
    c = Clock(verdict).at(1.0)
    out = c.send(v.SignalReceived(TERM))
    assert v.SignalAll(TERM) in out
    assert not any(isinstance(a, v.WritePreemptSignal) for a in out)
    c.send(v.ProcessExited(0, 143, 1001.1))
    assert verdict.result == 143 and "no worker watches for preemption" in verdict.summary()


def test_preemption_with_a_listener_gets_grace_then_reports_resumable() -> None:
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.PreemptListening())
    out = c.send(v.SignalReceived(USR1))
    assert any(isinstance(a, v.WritePreemptSignal) for a in out)
    assert verdict.phase == v.Phase.PREEMPTING and verdict.next_deadline() == 31.0
    c.at(5.0).send(v.PreemptAcknowledged())
    c.send(v.ProcessExited(0, 0, 1005.0))
    assert verdict.finished and verdict.result == 75
    assert "resumable" in verdict.summary()


def test_grace_period_expiry_stops_the_workers_with_143() -> None:
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.PreemptListening())
    c.send(v.SignalReceived(TERM))
    c.at(31.5)
    assert v.SignalAll(TERM) in c.actions and verdict.phase == v.Phase.STOPPING
    c.send(v.ProcessExited(0, 143, 1031.6))
    assert verdict.result == 143
    assert "did not stop within the preemption grace period of 30s" in verdict.summary()


def test_second_sigint_kills_at_once() -> None:
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.SignalReceived(INT))
    out = c.at(1.5).send(v.SignalReceived(INT))
    assert out == [v.SignalAll(KILL)]


def test_a_repeated_parent_death_term_is_one_preemption_request() -> None:
    """Linux re-sends the parent-death TERM as each thread of a dying
    multi-threaded parent exits: two TERMs within DUPLICATE_SIGNAL are one
    request (the trial keeps its grace to checkpoint); a later one is a
    second and stops at once, as before."""
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.PreemptListening())
    c.send(v.SignalReceived(TERM))
    assert verdict.phase == v.Phase.PREEMPTING
    assert c.at(1.0 + v.DUPLICATE_SIGNAL / 2).send(v.SignalReceived(TERM)) == []
    assert verdict.phase == v.Phase.PREEMPTING and verdict.result is None
    c.at(2.0).send(v.SignalReceived(TERM))
    assert verdict.phase == v.Phase.STOPPING
    c.send(v.ProcessExited(0, 143, 1002.1))
    assert verdict.result == 128 + TERM
    assert "received a second SIGTERM during preemption" in verdict.summary()


def test_kill_follows_term_after_kill_after_and_repeats() -> None:
    verdict = make(kill_after=2.0)
    c = Clock(verdict).at(1.0)
    c.send(v.SignalReceived(INT))
    c.actions.clear()
    c.at(2.9)
    assert v.SignalAll(KILL) not in c.actions
    c.at(3.0)
    assert c.actions.count(v.SignalAll(KILL)) == 1
    c.at(4.0)
    assert c.actions.count(v.SignalAll(KILL)) == 2


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_first_failure_is_the_earliest_genuine_one_in_every_order(order: tuple[int, ...]) -> None:
    # rank 1 exits 2 first; torchrun then kills rank 0 (143) and exits 1 itself.
    events: list[v.Event] = [
        v.RankExited(0, 143, 1001.05),
        v.RankExited(1, 2, 1001.00),
        v.ProcessExited(0, 1, 1001.10),
    ]
    verdict = make()
    c = Clock(verdict).at(1.2)
    for i in order:
        c.send(events[i])
    assert verdict.finished and verdict.result == 2
    assert "rank 1 on node 0 (h0) exited with status 2 first" in verdict.summary()
    assert "ranks failed" not in verdict.summary()  # the 143 was torchrun's teardown


def test_deaths_after_the_stop_never_become_the_verdict() -> None:
    verdict = make(roles=("worker", "worker"))
    c = Clock(verdict).at(1.0)
    c.send(v.RankExited(1, 2, 1000.9))  # genuine: stop begins at wall 1001.0
    c.send(v.RankExited(0, 1, 1001.2))  # rank 0 exits 1 after our TERM
    c.send(v.ProcessExited(0, 1, 1001.3))
    c.send(v.ProcessExited(1, 2, 1001.3))
    assert verdict.result == 2 and "rank 1" in verdict.summary()


def test_a_rank_that_noticed_a_lost_peer_is_never_named_before_that_peer() -> None:
    """Rank 1 raises and its interpreter's teardown is slow; rank 0 notices the
    disconnect, notes it (core's rank-0.lost-1), and exits first. Rank 1 is named,
    with its own status, although it exited after the stop began."""
    verdict = make(roles=("worker",))
    c = Clock(verdict).at(1.0)
    c.send(v.RankLostPeers(0, (1,)))
    c.send(v.RankExited(0, 1, 1000.9))  # the stop begins at wall 1001.0
    c.at(1.5).send(v.RankExited(1, 7, 1001.5))
    c.send(v.ProcessExited(0, 7, 1001.6))
    assert verdict.result == 7
    assert "rank 1 on node 0 (h0) exited with status 7 first (2 ranks failed)" in \
        verdict.summary()


def test_a_lost_peer_ended_by_our_stop_is_named_with_the_noticing_ranks_status() -> None:
    verdict = make(roles=("worker",))
    c = Clock(verdict).at(1.0)
    c.send(v.RankLostPeers(0, (1,)))
    c.send(v.RankExited(0, 1, 1000.9))
    c.at(1.5).send(v.RankExited(1, 143, 1001.5))  # our TERM ended its slow teardown
    c.send(v.ProcessExited(0, 143, 1001.6))
    assert verdict.result == 1  # never the status of a death we caused
    assert "rank 1 on node 0 (h0) failed (rank 0 lost its connection to it; a stop then " \
           "ended it, status 143) first (2 ranks failed); exit status 1" in verdict.summary()


def test_a_lost_peer_ended_by_the_frameworks_stop_before_ours_is_named_the_same_way() -> None:
    """torchrun TERMs rank 1 (in its slow teardown) as soon as rank 0 exits, before our
    launcher has seen rank 0's exit: rank 1's 143 is still not the cause's status."""
    verdict = make(roles=("worker",))
    c = Clock(verdict).at(1.0)
    c.send(v.RankLostPeers(0, (1,)))
    c.send(v.RankExited(0, 1, 1000.9))  # our stop begins at wall 1001.0
    c.send(v.RankExited(1, 143, 1000.95))  # torchrun's TERM, before ours
    c.at(1.5).send(v.ProcessExited(0, 1, 1001.6))
    assert verdict.result == 1
    assert "rank 1 on node 0 (h0) failed (rank 0 lost its connection to it; a stop then " \
           "ended it, status 143) first (2 ranks failed); exit status 1" in verdict.summary()


def test_a_rank_killed_before_its_peer_lost_it_keeps_its_own_status() -> None:
    verdict = make(roles=("worker",))
    c = Clock(verdict).at(1.0)
    c.send(v.RankExited(1, 137, 1000.8))  # the OOM killer; rank 0 notices afterwards
    c.send(v.RankLostPeers(0, (1,)))
    c.send(v.RankExited(0, 1, 1000.9))
    c.at(1.5).send(v.ProcessExited(0, 1, 1001.6))
    assert verdict.result == 137
    assert "rank 1 on node 0 (h0) was killed by SIGKILL (status 137) first" in verdict.summary()


def test_without_a_note_a_death_after_the_stop_is_still_ours() -> None:
    verdict = make(roles=("worker",))
    c = Clock(verdict).at(1.0)
    c.send(v.RankLostPeers(0, (2,)))  # blames another rank, not the late one
    c.send(v.RankExited(0, 1, 1000.9))
    c.at(1.5).send(v.RankExited(1, 7, 1001.5))
    c.send(v.ProcessExited(0, 1, 1001.6))
    assert verdict.result == 1 and "rank 0 on node 0" in verdict.summary()


def test_mutual_blame_falls_back_to_the_earliest() -> None:
    a = v.Failure(1, "rank 0", 0, "h", 2.0, blames=("rank 1",))
    b = v.Failure(1, "rank 1", 0, "h", 1.0, blames=("rank 0",))
    assert v.pick_cause([a, b]) == b
    assert v.Failure.from_message(a.to_message()) == a


def test_lost_peer_notes_are_parsed_strictly() -> None:
    from determined_launch.supervisor.files import lost_peers
    assert lost_peers("rank-3.lost-0,12") == v.RankLostPeers(3, (0, 12))
    for bad in ("rank-3.lost-", "rank-x.lost-1", "rank-3.lost-1,a", "rank-3.json",
                "rank-3.lost-" + ",".join(["1"] * 40)):
        assert lost_peers(bad) is None, bad


def test_two_ranks_failing_alike_names_the_earliest_and_counts_both() -> None:
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.RankExited(1, 2, 1000.95))
    c.send(v.RankExited(0, 2, 1000.90))
    c.send(v.ProcessExited(0, 1, 1001.2))
    assert verdict.result == 2
    assert "rank 0 on node 0 (h0) exited with status 2 first (2 ranks failed)" in verdict.summary()


def test_a_genuine_failure_outranks_an_interruption_that_came_after_it() -> None:
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.SignalReceived(INT))  # stop begins at wall 1001.0
    c.send(v.RankExited(0, 3, 1000.5))  # but rank 0 had already failed
    c.send(v.ProcessExited(0, 130, 1001.1))
    assert verdict.result == 3


def test_a_service_exiting_early_is_a_failure() -> None:
    verdict = make(roles=("worker", "service"))
    c = Clock(verdict).at(1.0)
    c.send(v.ProcessExited(1, 0, 1001.0))
    assert verdict.phase == v.Phase.STOPPING
    c.send(v.ProcessExited(0, 143, 1001.1))
    assert verdict.result == 1 and "(a service) exited early" in verdict.summary()


def test_success_stops_the_services_and_exits_0() -> None:
    verdict = make(roles=("worker", "service"))
    c = Clock(verdict).at(1.0)
    out = c.send(v.ProcessExited(0, 0, 1001.0))
    assert v.SignalAll(TERM) in out and not verdict.finished
    c.send(v.ProcessExited(1, 143, 1001.1))
    assert verdict.finished and verdict.result == 0


def test_chief_waits_the_window_and_names_the_earliest_failure_of_any_node() -> None:
    verdict = make(role=v.Role.CHIEF, nodes=2)
    c = Clock(verdict).at(1.0)
    c.send(v.PeerMessage({"type": "hello", "node": 1}))
    c.send(v.RankExited(0, 1, 1001.0))
    assert verdict.phase == v.Phase.RUNNING  # inside the window
    remote = v.Failure(7, "rank 3", 1, "h1", 1000.8)
    c.at(1.2).send(v.PeerMessage({"type": "failed", **remote.to_message()}))
    c.at(1.6)
    aborts = [a for a in c.actions if isinstance(a, v.Broadcast) and a.msg["type"] == "abort"]
    assert len(aborts) == 1 and aborts[0].msg["failure"]["what"] == "rank 3"
    c.send(v.ProcessExited(0, 143, 1001.7))
    assert verdict.result == 7 and "rank 3 on node 1 (h1)" in verdict.summary()


def test_node_prints_the_chiefs_verdict() -> None:
    verdict = make(role=v.Role.NODE, node=1, nodes=2)
    c = Clock(verdict).at(1.0)
    remote = v.Failure(7, "rank 0", 0, "h0", 1000.8)
    c.send(v.PeerMessage({"type": "abort", "failure": remote.to_message(), "failures": 2}))
    c.send(v.ProcessExited(0, 143, 1001.1))
    assert verdict.result == 7
    assert "rank 0 on node 0 (h0) exited with status 7 first (2 ranks failed)" in verdict.summary()


def test_node_interrupt_is_reported_to_the_chief() -> None:
    verdict = make(role=v.Role.NODE, node=1, nodes=2)
    c = Clock(verdict).at(1.0)
    out = c.send(v.SignalReceived(INT))
    sent = [a.msg for a in out if isinstance(a, v.SendToChief)]
    assert sent and sent[0]["type"] == "failed" and sent[0]["interrupt"] is True
    c.send(v.ProcessExited(0, 130, 1001.1))
    assert verdict.phase == v.Phase.DRAINING  # waits briefly for the chief's word
    c.at(1.0 + v.DRAIN_WAIT + 0.1)
    assert verdict.finished and verdict.result == 130


def test_chief_interrupt_is_not_blamed_on_the_workers_it_signalled() -> None:
    verdict = make(role=v.Role.CHIEF, nodes=2)
    c = Clock(verdict).at(1.0)
    c.send(v.SignalReceived(INT))  # the chief waits its window; workers die of SIGINT meanwhile
    c.at(1.1).send(v.RankExited(1, 130, 1001.1))
    c.at(1.6)
    c.send(v.ProcessExited(0, 130, 1001.7))
    assert verdict.result == 130
    assert "the launcher on node 0 (h0) was interrupted by SIGINT" in verdict.summary()


def test_lost_launcher_is_described_as_lost_not_as_an_exit_status() -> None:
    verdict = make(role=v.Role.CHIEF, nodes=2)
    c = Clock(verdict).at(1.0)
    c.send(v.PeerMessage({"type": "hello", "node": 1}))
    c.send(v.PeerMessage({"type": "lost", "node": 1, "why": "was lost (no heartbeat for 10s)"}))
    c.at(2.0)
    c.send(v.ProcessExited(0, 143, 1002.1))
    assert "the launcher on node 1 (h1) was lost (no heartbeat for 10s)" in verdict.summary()


def test_multi_node_success_needs_every_node() -> None:
    chief = make(role=v.Role.CHIEF, nodes=2)
    c = Clock(chief).at(1.0)
    c.send(v.ProcessExited(0, 0, 1001.0))
    assert chief.phase == v.Phase.DRAINING and chief.waiting_on_peer()
    out = c.send(v.PeerMessage({"type": "done", "node": 1, "status": 0}))
    assert v.Broadcast({"type": "finish", "status": 0}) in out
    assert chief.finished and chief.result == 0


# ------------------------------------------------------------ the invariant
_EVENTS = st.one_of(
    st.builds(v.SignalReceived, st.sampled_from([INT, TERM, USR1, signal.SIGHUP])),
    st.builds(v.ProcessExited, st.integers(0, 1), st.sampled_from([0, 1, 2, 137, 143]),
              st.floats(1000, 1100)),
    st.builds(v.RankExited, st.integers(0, 3), st.sampled_from([0, 1, 143]),
              st.floats(1000, 1100)),
    st.just(v.PreemptListening()),
    st.just(v.PreemptAcknowledged()),
    st.just(v.PreemptFileAppeared("/x")),
    st.builds(v.PeerMessage, st.sampled_from([
        {"type": "hello", "node": 1},
        {"type": "failed", **v.Failure(1, "rank 2", 1, "h1", 1000.5).to_message()},
        {"type": "failed", **v.Failure(130, "the launcher", 1, "h1", 1000.5,
                                       interrupt=True).to_message()},
        {"type": "done", "node": 1, "status": 0},
        {"type": "done", "node": 1, "status": 75},
        {"type": "preempt", "node": 1},
        {"type": "lost", "node": 1, "why": "was lost"},
        {"type": "abort", "failure": v.Failure(2, "rank 0", 0, "h0", 1000.1).to_message()},
        {"type": "finish", "status": 0},
        {"type": "lost", "node": 0},
        {"type": "bogus"},
    ])),
    st.floats(0.0, 40.0).map(lambda dt: ("advance", dt)),
)


def _run_until_done(verdict: v.Verdict, now: float, ignores_term: set[int]) -> float:
    """Play the world: processes die when signalled (some only on KILL), a
    waited-on peer launcher eventually goes silent, time jumps to the next
    deadline. Returns when the verdict is finished; fails if it would wait
    forever."""
    for _ in range(200):
        if verdict.finished:
            return now
        # A state that stopped must be waiting on something bounded.
        if verdict.phase != v.Phase.RUNNING:
            assert verdict.next_deadline() is not None or verdict.waiting_on_peer() or (
                verdict.phase == v.Phase.PREEMPTING
            ), f"stuck in {verdict.phase} with nothing to wait for"
        deadline = verdict.next_deadline()
        if deadline is not None and deadline > now:
            now = deadline
            actions = verdict.tick(now, 1000.0 + now)
        elif verdict.phase == v.Phase.RUNNING and verdict.alive:
            # The job would run on; stop it the way a user would.
            actions = verdict.handle(v.SignalReceived(INT), now, 1000.0 + now)
        elif verdict.waiting_on_peer():
            actions = verdict.handle(v.PeerMessage({"type": "lost", "node": 0 if
                                     verdict.s.role == v.Role.NODE else 1}), now, 1000.0 + now)
        else:
            actions = verdict.tick(now, 1000.0 + now)
        for a in actions:
            if isinstance(a, v.SignalAll) and a.sig in (TERM, KILL):
                for i in sorted(verdict.alive):
                    if a.sig == KILL or i not in ignores_term:
                        status = 128 + a.sig
                        actions += verdict.handle(v.ProcessExited(i, status, 1000.0 + now), now,
                                                  1000.0 + now)
    raise AssertionError(f"never finished: phase {verdict.phase}, alive {verdict.alive}")


@settings(max_examples=300, deadline=None)
@given(
    role=st.sampled_from(list(v.Role)),
    events=st.lists(_EVENTS, max_size=12),
    ignores_term=st.sets(st.integers(0, 1)),
)
def test_every_reachable_state_waits_with_a_deadline_or_exits(
    role: v.Role, events: list[Any], ignores_term: set[int]
) -> None:
    verdict = make(role=role, node=1 if role == v.Role.NODE else 0,
                   nodes=1 if role == v.Role.SINGLE else 2, roles=("worker", "service"))
    now = 0.0
    for e in events:
        if isinstance(e, tuple):
            now += e[1]
            verdict.tick(now, 1000.0 + now)
        else:
            verdict.handle(e, now, 1000.0 + now)
    stopping_since = now if verdict.phase == v.Phase.STOPPING else None
    end = _run_until_done(verdict, now, ignores_term)
    assert verdict.result is not None and not verdict.alive
    assert f"exit status {verdict.result}" in verdict.summary()
    if role == v.Role.SINGLE and stopping_since is not None:
        # TERM, then KILL after kill_after: never longer, whatever the workers do.
        assert end - stopping_since <= verdict.s.kill_after + 1e-6


def test_a_rank_that_finished_then_aborted_at_exit_is_named_so() -> None:
    """Issue 23 item 1b: core.init() exited cleanly on rank 1 (its note), then
    the process died of SIGABRT at interpreter exit: the summary says both."""
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.RankFinished(1))
    c.send(v.RankExited(0, 0, 1000.9))
    c.send(v.RankExited(1, 134, 1001.0))
    c.send(v.ProcessExited(0, 1, 1001.1))
    assert verdict.finished and verdict.result == 134
    assert verdict.summary() == (
        "job failed: rank 1 on node 0 (h0) had finished its work (core.init() exited "
        "cleanly) and then was killed by SIGABRT (status 134) first; exit status 134")


def test_a_rank_that_did_not_finish_is_named_as_before() -> None:
    verdict = make()
    c = Clock(verdict).at(1.0)
    c.send(v.RankFinished(0))  # another rank's note says nothing about rank 1
    c.send(v.RankExited(1, 134, 1001.0))
    c.send(v.ProcessExited(0, 1, 1001.1))
    assert "rank 1 on node 0 (h0) was killed by SIGABRT (status 134) first" in verdict.summary()
