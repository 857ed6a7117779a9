"""A cache bounded in bytes: what the server keeps whatever the requests ask.

Every cache of the UI that a request can add to (parsed streams, downsampled
charts, previews) is one of these: the least recently used entries go once
the estimated bytes pass the limit, so a visitor who asks for every
``max_points`` of every run makes the server re-read files, never grow.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Optional, TypeVar

V = TypeVar("V")


class ByteLru(Generic[V]):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Optional[V]:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def __getitem__(self, key: Hashable) -> V:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def put(self, key: Hashable, value: V, nbytes: int) -> None:
        """Add or re-size ``key`` (the newest); older entries go past the limit.
        The entry just put stays even if it alone is over the limit: evicting
        it would make every request parse it again."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.limit and len(self._items) > 1:
                _, (_, size) = self._items.popitem(last=False)
                self._bytes -= size

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
