"""What the Core API needs from a DistributedContext.

A structural type rather than the class itself, so each piece of the Core
API states the few collectives it relies on, and pure-logic unit tests can
drive it with an in-process stand-in.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol


class Collectives(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def allgather(self, stuff: Any) -> list[Any]: ...

    def broadcast(self, stuff: Any) -> Any: ...

    def gather(self, stuff: Any) -> Optional[list[Any]]: ...

    def close(self) -> None: ...
