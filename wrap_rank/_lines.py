"""Turn a byte stream into ``[rank=N] ``-prefixed lines, a chunk at a time.

The rules (see docs/wrap_rank.md):

* ``\\n`` ends a line; ``\\r\\n`` ends one line (the ``\\r`` is dropped); a run
  of ``\\r`` that is not followed by ``\\n`` ends a line too, so tqdm's
  ``\\r``-redrawn bars become one line per redraw.
* A bare ``\\r`` at the start of a line ends nothing (it would only produce an
  empty line: tqdm starts every redraw with one).
* A line longer than ``cap`` bytes is emitted in pieces of ``cap`` bytes.
* Bytes are never decoded, so invalid UTF-8 passes through unchanged.
* ``duplicate``: a label of the child's own that says what our prefix says
  (torch's ``[rank0]:``, which its excepthook puts before every traceback
  line once a process group exists, and ``TORCH_LOGS`` before its records)
  is dropped from the start of a line, with the one space after it, so a
  line carries one rank label. Another rank's label stays.

The work is done with whole-chunk ``bytes`` operations (``find``,
``replace``, slicing), which run in C; Python code runs per chunk, not per
line, which is what makes wrap_rank fast enough for chatty workers.
"""

from __future__ import annotations

#: Longest line content emitted in one piece, in bytes (not counting the
#: prefix and the newline). Equal to the read size, so that every line that
#: starts and ends inside one read is short enough by construction.
LINE_CAP = 65536


class LinePrefixer:
    """Prefixes the lines of one stream; ``feed`` chunks, then ``flush`` at EOF.

    ``feed`` returns the output for every line the chunk completed and keeps
    the unfinished tail (the "carry", at most ``cap`` bytes of content plus a
    possible held-back ``\\r`` whose meaning depends on the next byte).
    """

    def __init__(self, prefix: bytes, cap: int = LINE_CAP, duplicate: bytes = b"") -> None:
        if cap < 1:
            raise ValueError("cap must be positive")
        self._prefix = prefix
        self._nl_prefix = b"\n" + prefix
        self._cap = cap
        self._carry = b""
        self._duplicate = duplicate

    def _dedupe(self, out: bytes) -> bytes:
        """``out`` (whole prefixed lines) without ``duplicate`` after a prefix.
        Called only when the child's bytes hold the label (searched there, not in
        the output, where every prefix's ``[rank`` is a near miss)."""
        dup = self._duplicate
        head = self._nl_prefix
        text = b"\n" + out  # every output starts with a prefix: match it like the others
        text = text.replace(head + dup + b" ", head).replace(head + dup, head)
        return text[1:]

    def feed(self, chunk: bytes) -> bytes:
        """Return the prefixed output of every line that ``chunk`` completes."""
        cap = self._cap
        if len(chunk) <= cap:
            return self._feed_piece(chunk)
        # Pieces no longer than the cap keep the fast path valid: any line
        # that begins and ends inside one piece is short enough.
        return b"".join([self._feed_piece(chunk[i : i + cap]) for i in range(0, len(chunk), cap)])

    def flush(self) -> bytes:
        """Return the unfinished last line (with a newline) at end of stream."""
        # A held-back "\r" at EOF simply ends the line.
        tail = self._carry.rstrip(b"\r")
        self._carry = b""
        out = self._prefix + tail + b"\n" if tail else b""
        return self._dedupe(out) if self._duplicate and self._duplicate in tail else out

    def _feed_piece(self, piece: bytes) -> bytes:
        data = self._carry + piece if self._carry else piece
        # memchr for the label's "[" first: a substring search costs ~30% of a feed
        dedupe = bool(self._duplicate) and b"[" in data and self._duplicate in data
        held_cr = False
        if b"\r" in data:
            data, held_cr = _normalize_cr(data)
        cap = self._cap
        out: list[bytes] = []
        last = data.rfind(b"\n")
        if last < 0:
            tail = data
        else:
            first = data.find(b"\n")
            start = 0
            if first > cap:
                # Only the first line can be too long: it continues the
                # carry. Every later complete line lies inside this piece.
                out.append(self._pieces(data[:first]))
                start = first + 1
            if start <= last:
                body = data[start:last]
                out.append(b"".join((self._prefix, body.replace(b"\n", self._nl_prefix), b"\n")))
            tail = data[last + 1 :]
        if len(tail) > cap:
            cut = (len(tail) - 1) // cap * cap
            out.append(self._pieces(tail[:cut]))
            tail = tail[cut:]
        self._carry = tail + b"\r" if held_cr else tail
        done = b"".join(out) if len(out) != 1 else out[0]
        return self._dedupe(done) if dedupe else done

    def _pieces(self, line: bytes) -> bytes:
        """One over-long line (no newline inside) as cap-sized prefixed lines."""
        cap = self._cap
        return b"".join(
            [self._prefix + line[i : i + cap] + b"\n" for i in range(0, len(line), cap)]
        )


def _normalize_cr(data: bytes) -> tuple[bytes, bool]:
    """Rewrite every line end in ``data`` as ``\\n`` (see the module rules).

    ``data`` always begins at the start of a line. Returns the rewritten
    bytes and whether a trailing ``\\r`` was removed and must be held back:
    only the next byte tells whether it is a CRLF or a bare carriage return.
    """
    while b"\r\r" in data:
        data = data.replace(b"\r\r", b"\r")
    data = data.replace(b"\r\n", b"\n").replace(b"\n\r", b"\n")
    if data[:1] == b"\r":
        data = data[1:]
    held = data[-1:] == b"\r"
    if held:
        data = data[:-1]
    return data.replace(b"\r", b"\n"), held
