"""Answers kept whole while their inputs are unchanged (issue 36 §3).

A 10,000-trial experiment's trials answer is 3 MB; building and hashing it
on every poll of every tab cost 22-50 ms of server CPU a second each. An
answer is kept here with its ETag, keyed by the *signature* of what it was
made from (the stat of the study's file and ``experiment.json``, the kill
marker, the background filler's progress): an unchanged poll is a few
``stat`` calls and a 304. An answer that depends on the clock (a running
trial's heartbeat, a running experiment's duration) is never kept. The kept
bytes are bounded (``cache.ByteLru``), like every cache of the server.

On a cold server the page's first answers (summary, trials, searcher
metric) are what its first paint waits for, so while one is being made the
background work (the trials' file columns, importance) waits (``FOREGROUND``),
and two requests for one answer make it once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Optional

from determined_launch.ui.cache import ByteLru

#: bytes of kept answers (a 10,000-trial experiment's four: about 5 MB)
BODY_CACHE_BYTES = 32 << 20


def etag_of(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def stat_signature(path: str) -> Optional[tuple[int, int, int, int]]:
    """What changes when a file is written or replaced (None: not there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


#: background work starts this long after the last answer a page waited for
SETTLE_S = 0.5


class Foreground:
    """The threads making an answer a page waits for. Background work calls
    ``wait_quiet`` between its steps: on a 2-core machine, one Python process,
    a thread filling in 10,000 rows' files beside the first request takes
    half of that request's interpreter time."""

    def __init__(self) -> None:
        self._busy: dict[int, int] = {}  # thread id -> nesting
        self._cond = threading.Condition()
        self._quiet_since = 0.0  # when the last answer was made (monotonic)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            self._busy[me] = self._busy.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                if self._busy[me] == 1:
                    del self._busy[me]
                    self._quiet_since = time.monotonic()
                    self._cond.notify_all()
                else:
                    self._busy[me] -= 1

    def wait_quiet(self, limit: float, settle: float = SETTLE_S) -> None:
        """Until no other thread has made an answer for ``settle`` seconds (the
        page draws meanwhile, and asks its next answers), or ``limit`` seconds
        (never starved)."""
        me = threading.get_ident()
        deadline = time.monotonic() + limit
        with self._cond:
            while True:
                now = time.monotonic()
                busy = any(t != me for t in self._busy)
                if not busy and now - self._quiet_since >= settle:
                    return
                if now >= deadline:
                    return
                wake = deadline if busy else min(deadline, self._quiet_since + settle)
                self._cond.wait(wake - now)


#: one per process: the server's answers and its background work share one interpreter
FOREGROUND = Foreground()


class Bodies:
    """Kept answers: ``get`` builds only when the signature changed."""

    def __init__(self, limit: int = BODY_CACHE_BYTES) -> None:
        self._kept: ByteLru[tuple[Hashable, bytes, str]] = ByteLru(limit)
        self._lock = threading.Lock()
        self._making: dict[Hashable, threading.Lock] = {}  # key -> held while it is made
        #: answers built (a test counts these: an unchanged poll builds none)
        self.builds = 0

    def get(self, key: Hashable, signature: Optional[Hashable],
            build: Callable[[], Optional[tuple[bytes, bool]]],
            urgent: bool = True) -> Optional[tuple[bytes, str]]:
        """(body, ETag), or None if ``build`` found nothing. ``build`` returns
        (body, whether it may be kept); a None signature is never kept.
        ``urgent``: a page's first paint waits for it (``FOREGROUND``)."""
        hit = self._kept.get(key) if signature is not None else None
        if hit is not None and hit[0] == signature:
            return hit[1], hit[2]
        with FOREGROUND.busy() if urgent else contextlib.nullcontext():
            with self._lock:
                making = self._making.setdefault(key, threading.Lock())
            with making:  # a second asker takes the first one's answer
                hit = self._kept.get(key) if signature is not None else None
                if hit is not None and hit[0] == signature:
                    return hit[1], hit[2]
                return self._build(key, signature, build)

    def _build(self, key: Hashable, signature: Optional[Hashable],
               build: Callable[[], Optional[tuple[bytes, bool]]]) -> Optional[tuple[bytes, str]]:
        self.builds += 1
        made = build()
        if made is None:
            return None
        body, keep = made
        tag = etag_of(body)
        if keep and signature is not None:
            self._kept.put(key, (signature, body, tag), len(body) + 200)
        return body, tag
