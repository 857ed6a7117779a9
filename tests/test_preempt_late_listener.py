"""A node whose workers are still starting (before ``core.init``) when the
chief preempts the generation for a rejoining node (pure: the verdict alone).

The chief broadcasts a preemption only when its own workers listen, so the
job's workers do listen: this node's are late, not deaf. It stopped "at once"
as if nobody listened, an interruption, and the whole job ended there
("the job was stopped on request"): seen once on GCS by hand, reproduced on a
shared directory with a node whose worker reached core.init 4 s late."""

from __future__ import annotations

import signal

from determined_launch.supervisor import verdict as v
from tests.test_verdict import Clock, make


def test_a_node_not_yet_listening_takes_the_chiefs_preemption_with_grace() -> None:
    verdict = make(role=v.Role.NODE, node=1, nodes=2)
    c = Clock(verdict).at(1.0)
    out = c.send(v.PeerMessage({"type": "preempt"}))  # the chief makes room for a rejoin
    assert verdict.phase == v.Phase.PREEMPTING, verdict.summary() if verdict.finished else out
    assert any(isinstance(a, v.WritePreemptSignal) for a in out)
    assert not any(isinstance(a, v.SignalAll) for a in out)
    c.at(4.0).send(v.PreemptListening())  # its worker reaches core.init, sees the signal
    c.send(v.PreemptAcknowledged())
    c.send(v.ProcessExited(0, 0, 1004.5))
    assert all(not f.interrupt for f in verdict.candidates)
    assert signal.SIGTERM not in [a.sig for a in c.actions if isinstance(a, v.SignalAll)]
