"""Run a node's ``LaunchPlan`` and stop it well.

* ``processes``: the only code that starts, signals and reaps processes.
* ``verdict``: the pure state machine that decides phases, the first
  failure and the exit status (events in, actions out).
* ``control``: the authenticated channel between the node launchers.
* ``node``: the loop that joins them.
"""

from determined_launch.supervisor.config import DEFAULT_PREEMPT_SIGNALS, SupervisorConfig
from determined_launch.supervisor.files import write_private_file
from determined_launch.supervisor.node import Supervisor, supervise

__all__ = [
    "DEFAULT_PREEMPT_SIGNALS",
    "Supervisor",
    "SupervisorConfig",
    "supervise",
    "write_private_file",
]
