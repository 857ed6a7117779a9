"""Run a node's ``LaunchPlan`` and stop it well.

* ``processes``: the only code that starts, signals and reaps processes.
* ``verdict``: the pure state machine that decides phases, the first
  failure and the exit status (events in, actions out).
* ``control``: the links between the node launchers; ``channel`` is their
  authenticated wire.
* ``relay``: a framework launcher's output, split into its workers' lines
  (passed on) and its own (logged).
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
