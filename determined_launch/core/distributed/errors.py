"""Errors and warnings of ``DistributedContext`` (re-exported by the package)."""

from __future__ import annotations

from collections.abc import Iterable

from determined_launch.errors import LaunchError


class DistributedError(RuntimeError):
    """A collective cannot complete: a peer died, timed out or disagreed.

    ``missing_ranks`` names the ranks that were not heard from (empty when
    the failure is not about particular ranks). Once raised, the context is
    unusable: every later collective raises the same error.
    """

    def __init__(
        self, message: str, missing_ranks: Iterable[int] = (), relayed: bool = False
    ) -> None:
        super().__init__(message)
        self.missing_ranks = tuple(sorted(missing_ranks))
        #: True when another rank detected the failure and told this one.
        self.relayed = relayed


class DistributedConfigError(DistributedError, LaunchError):
    """A ``DistributedContext`` that cannot start because of its configuration
    (busy port, missing secret, bad environment). Also a ``LaunchError``, so
    entry points print it as one line and exit with status 2."""


class InsecureWarning(UserWarning):
    """DistributedContext runs without a secret: messages are not authenticated."""


def format_ranks(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    word = "rank" if len(listed) == 1 else "ranks"
    return f"{word} {', '.join(map(str, listed))}"
