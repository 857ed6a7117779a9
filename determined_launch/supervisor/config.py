"""Supervision knobs; the launcher's option table (``config.py``) fills them in."""

from __future__ import annotations

import dataclasses
import signal
from typing import Optional

DEFAULT_PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    #: Seconds workers get to checkpoint and exit after a preemption request.
    preempt_grace: float = 30.0
    #: Seconds between TERM and KILL when stopping.
    kill_after: float = 10.0
    preempt_signals: tuple[int, ...] = DEFAULT_PREEMPT_SIGNALS
    #: Operator's preemption file (``DET_PREEMPT_FILE``): its appearance preempts.
    preempt_file: Optional[str] = None
    #: Seconds a non-chief launcher waits for the chief's, and the chief for all nodes.
    connect_timeout: float = 300.0
    #: Show framework launchers' own output (torchrun's agent & co.) instead
    #: of keeping it in a log file.
    verbose: bool = False
    #: ``--hang-timeout``: a rank silent this long after its first progress is hung (None: off).
    hang_timeout: Optional[float] = None
