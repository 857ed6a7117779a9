"""Errors and exit statuses shared by every layer.

Exit statuses are part of the public contract (see README, "Exit statuses"):
a launcher returns 0 on success, the first failing worker's status otherwise
(128+N when it was killed by signal N), 2 for usage and configuration errors,
and ``EXIT_PREEMPTED`` when the job stopped because of a preemption that the
workers acknowledged, meaning "resumable: run the same command again".
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_OK = 0
EXIT_USAGE = 2
# sysexits' EX_TEMPFAIL: "temporary failure, the user is invited to retry".
EXIT_PREEMPTED = 75
# A rank hung (no progress for --hang-timeout): timeout(1)'s status for "timed out".
EXIT_HUNG = 124


class LaunchError(Exception):
    """A user-facing error: printed as one line, then the launcher exits.

    Raise it (or a subclass) for anything a user can fix; the entry points
    turn it into ``det-launch: <message>`` and ``exit_status`` instead of a
    traceback.
    """

    exit_status = EXIT_USAGE


class ClusterInfoError(LaunchError):
    """Rendezvous information is present but unusable (bad file, bad env)."""


# --- Determined's exception names (``det.errors.X``) used by the PyTorch API ---


class InvalidExperimentException(Exception):
    """The trial or its configuration is unusable (e.g. a bad evaluation reducer)."""


class InternalException(Exception):
    """A condition the framework should never reach; report it as a bug."""


class InvalidCheckpointException(Exception):
    """A checkpoint is missing files or was written by an incompatible trial."""


class UsageParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line naming the command and exit
    status 2 (``--help`` keeps the full usage). Subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
