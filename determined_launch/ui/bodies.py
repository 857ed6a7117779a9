"""Answers kept whole while their inputs are unchanged (issue 36 §3).

A 10,000-trial experiment's trials answer is 3 MB; building and hashing it
on every poll of every tab cost 22-50 ms of server CPU a second each. An
answer is kept here with its ETag, keyed by the *signature* of what it was
made from (the stat of the study's file and ``experiment.json``, the kill
marker, the background filler's progress): an unchanged poll is a few
``stat`` calls and a 304. An answer that depends on the clock (a running
trial's heartbeat, a running experiment's duration) is never kept. The kept
bytes are bounded (``cache.ByteLru``), like every cache of the server.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Hashable
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


class Bodies:
    """Kept answers: ``get`` builds only when the signature changed."""

    def __init__(self, limit: int = BODY_CACHE_BYTES) -> None:
        self._kept: ByteLru[tuple[Hashable, bytes, str]] = ByteLru(limit)
        #: answers built (a test counts these: an unchanged poll builds none)
        self.builds = 0

    def get(self, key: Hashable, signature: Optional[Hashable],
            build: Callable[[], Optional[tuple[bytes, bool]]]) -> Optional[tuple[bytes, str]]:
        """(body, ETag), or None if ``build`` found nothing. ``build`` returns
        (body, whether it may be kept); a None signature is never kept."""
        hit = self._kept.get(key) if signature is not None else None
        if hit is not None and hit[0] == signature:
            return hit[1], hit[2]
        self.builds += 1
        made = build()
        if made is None:
            return None
        body, keep = made
        tag = etag_of(body)
        if keep and signature is not None:
            self._kept.put(key, (signature, body, tag), len(body) + 200)
        return body, tag
