"""The one rule for what is shown to people: secrets hidden, terminal escapes escaped.

Used by the WebUI (every page and log), the experiment console (hparams in
the table and the best-trial line), the dry-run plan's environment and the
trackers' warning lines. Standard library only; imports nothing of ours, so
every layer may use it.

* ``redact(value)``: a structure (hparams, metadata, configs) with the values
  of secret-looking keys replaced, and ``redact_text`` applied to its strings.
* ``redact_text(text)``: free text (logs, status notes, launcher lines):
  ``scheme://user:pw@host``, ``password=x``, ``{"password": "x"}``,
  ``'secret': 'x'``, ``Authorization: Bearer x``, ``--password x``.
* ``as_shown(text)``: a captured terminal's output without its colour codes
  and progress bars' overwritten states.
* ``printable(text)``: text from outside (a request path, a tracker server's
  error) made safe for a terminal: control characters (ESC, OSC's BEL, C1,
  newlines) written as ``\\x1b``-style escapes, so it is one inert line.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"
#: names whose value is a secret: job secrets, storage credentials, database
#: passwords, API tokens (``key`` alone only as a whole word part: ``db.key``)
_NAME = (r"secret|passw|pwd|token|credential|private[_-]?key|api[_-]?key|access[_-]?key"
         r"|authorization|auth[_-]?token")
SECRET_KEY = re.compile(rf"({_NAME}|^auth$|(^|[_.-])key$)", re.IGNORECASE)
#: ``scheme://user:password@host``: the userinfo goes (up to the last ``@`` before the path)
URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]{0,31}://)[^/\s@]*(?:@[^/\s@]*)*@")
#: ``key = value`` / ``"key": "value"`` / ``'key': value`` / ``key: Bearer value``
_VALUE = r"""(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|["']?[^\s,;&'"()\[\]{}<>]+)"""
#: (a name starts a word and is bounded: else a 1 MiB log line takes quadratic time)
TEXT_SECRET = re.compile(
    rf"""(?i)((?<![\w.-])[\w.-]{{0,64}}(?:{_NAME})[\w.-]{{0,64}}["']?\s*[=:]\s*"""
    rf"(?:(?:bearer|basic|token)\s+)?)({_VALUE})")
#: ``--password x`` on a command line (``--password=x`` is the rule above)
FLAG_SECRET = re.compile(
    rf"(?i)((?<![\w-])--?[\w-]{{0,64}}(?:{_NAME})[\w-]{{0,64}}\s+)(?!-)({_VALUE})")
#: a bare ``Bearer x`` (an HTTP header quoted without its name)
BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]{8,})")
#: C0 controls, DEL and C1 controls: what a terminal may act on
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def redact_text(text: str) -> str:
    """``text`` with credentials in URLs and secret-looking assignments masked."""
    text = URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    text = TEXT_SECRET.sub(_keep_quotes, text)
    text = FLAG_SECRET.sub(_keep_quotes, text)
    return BEARER.sub(rf"\1{REDACTED}", text)


#: a terminal's control sequence (colours, cursor moves): ESC [ params final
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: what a ``\r`` without its ``\n`` rewrote: a progress bar's earlier states
_REWRITTEN = re.compile(r"[^\n]*\r(?!\n|$)")


def as_shown(text: str) -> str:
    """Output captured from a terminal (``output.log``) as the terminal showed it:
    colour codes dropped, a line rewritten through ``\r`` as its last state."""
    return _REWRITTEN.sub("", _CSI.sub("", text))


def _keep_quotes(m: re.Match[str]) -> str:
    value = m.group(2)
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{m.group(1)}{quote}{REDACTED}{quote}"


@functools.lru_cache(maxsize=4096)
def secret_key(key: str) -> bool:
    """Whether a key's value is hidden (10,000 trials repeat a few keys)."""
    return SECRET_KEY.search(key) is not None


def redact(value: Any, depth: int = 0) -> Any:
    """``value`` with secret-looking keys' values and URL credentials replaced."""
    if depth > 32:
        return REDACTED
    if isinstance(value, Mapping):
        return {str(k): REDACTED if secret_key(str(k)) else redact(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, depth + 1) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return {9: "\\t", 10: "\\n", 13: "\\r"}.get(c, f"\\x{c:02x}")


def printable(text: object) -> str:
    """``text`` as one line a terminal shows and never acts on."""
    return _CONTROL.sub(_escape, str(text))
