"""Text that came from outside lctx (a server's reply, a model id it names, a file's contents, an exception's message
that quotes either) made safe to show, print and store: the one place secrets are redacted, control characters
escaped and quotes capped.

* :func:`register_secret` is called with every credential lctx holds (the API key read from ``--api-key-env``);
  :func:`redact` replaces each registered value, and any ``Bearer`` token or ``sk-...`` style key, by
  :data:`REDACTED`. Every message built from a server's reply and every sink (the console, ``records.jsonl``,
  ``run.json``, the CSV/parquet tables, ``report.md``/``report.html``, ``failures.csv``) passes through it.
* :func:`printable` escapes C0 and C1 control characters (ESC, BEL, CSI, the OSC that sets a terminal's title
  or clipboard), DEL and the Unicode bidirectional overrides ("Trojan Source") as visible ``\\x1b``-style escapes, so
  no byte from outside can drive a terminal or reorder what a reader sees. Tabs and newlines are kept unless
  ``one_line``.
* :func:`quote` is what an error line quoting a server uses: redacted, escaped, on one line and at most ``limit``
  characters, with the count of what was left out.
* :func:`clean` applies :func:`redact` and :func:`printable` to every string of a JSON-like value (dicts, lists,
  tuples; keys too), for a record or run.json.

No third-party imports (the CLI's light layer imports it).

Source: ECMA-48 / ISO 6429 (C0 0x00-0x1F, DEL 0x7F, C1 0x80-0x9F); Boucher and Anderson 2021, "Trojan Source"
(bidirectional controls U+202A-U+202E, U+2066-U+2069, U+200E/U+200F, U+061C); RFC 6750 (Bearer tokens).
"""

from __future__ import annotations

import re
import threading
from typing import Any

#: what a redacted secret is replaced by
REDACTED = "[redacted]"
#: the shortest registered value that is redacted (a shorter "key" would redact ordinary words and digits)
MIN_SECRET = 4
#: the longest quote of outside text in one error line (:func:`quote`'s default), characters
QUOTE_LIMIT = 240

_SECRETS: set[str] = set()
_LOCK = threading.Lock()
_SECRET_RE: re.Pattern | None = None

#: credentials recognised without being registered: ``Bearer <token>`` (RFC 6750) and OpenAI-style keys
#: (``sk-`` / ``sk-proj-`` followed by 16 or more key characters)
_PATTERNS = (
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]+=*"), r"\1 " + REDACTED),
    (re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_\-]{16,}"), REDACTED),
)

#: C0 controls but tab and newline, DEL, C1 controls, and the bidirectional formatting characters
_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_ANY_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def register_secret(value: Any) -> None:
    """Remember ``value`` (a str) as a secret that :func:`redact` removes from every text from now on, in this
    process. Values shorter than :data:`MIN_SECRET` characters after stripping are ignored (they would redact
    ordinary text; no real key is that short). Thread-safe."""
    global _SECRET_RE
    if not isinstance(value, str):
        return
    v = value.strip()
    if len(v) < MIN_SECRET:
        return
    with _LOCK:
        if v in _SECRETS:
            return
        _SECRETS.add(v)
        alts = sorted(_SECRETS, key=len, reverse=True)  # longest first: a key that contains another is removed whole
        _SECRET_RE = re.compile("|".join(re.escape(s) for s in alts))


def forget_secrets() -> None:
    """Forget every registered secret (tests; a long-lived process that switches keys)."""
    global _SECRET_RE
    with _LOCK:
        _SECRETS.clear()
        _SECRET_RE = None


def redact(text: Any) -> Any:
    """``text`` with every registered secret and every recognised credential pattern (``Bearer ...``, ``sk-...``)
    replaced by :data:`REDACTED`; a value that is not a str is returned as it is."""
    if not isinstance(text, str) or not text:
        return text
    pat = _SECRET_RE
    if pat is not None:
        text = pat.sub(REDACTED, text)
    for rx, repl in _PATTERNS:
        text = rx.sub(repl, text)
    return text


def _escape(m: re.Match) -> str:
    c = m.group(0)
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def has_control(text: Any) -> bool:
    """Whether ``text`` holds a character :func:`printable` would escape (tab and newline counted too)."""
    return isinstance(text, str) and _CONTROL_ANY_RE.search(text) is not None


def printable(text: Any, one_line: bool = False) -> Any:
    """``text`` with each control character (C0 but tab and newline, DEL, C1, bidirectional overrides) written as
    a visible escape (``"\\x1b"``, ``"\\u202e"``); ``one_line``: tabs and newlines escaped too. A value that is not
    a str is returned as it is."""
    if not isinstance(text, str) or not text:
        return text
    return (_CONTROL_ANY_RE if one_line else _CONTROL_RE).sub(_escape, text)


def safe(text: Any, one_line: bool = False) -> Any:
    """:func:`printable` of :func:`redact`: what any sink writes of a str from outside."""
    return printable(redact(text), one_line=one_line)


def quote(text: Any, limit: int = QUOTE_LIMIT) -> str:
    """Outside text as a part of one error line: ``str(text)`` redacted, its whitespace runs collapsed to one space,
    control characters escaped, and cut to ``limit`` characters with ``"... (N more characters left out)"``."""
    s = redact(str(text))
    s = " ".join(s.split())
    s = printable(s, one_line=True)
    if len(s) > limit:
        s = s[:limit] + f"... ({len(s) - limit} more characters left out)"
    return s


#: the longest line a sink prints or writes of one message (:func:`cap`'s default), characters: a bound on an
#: ``error:`` or ``warning:`` line however much outside text reached it, far above any message lctx writes itself
LINE_LIMIT = 2000


def cap(text: Any, limit: int = LINE_LIMIT) -> str:
    """A whole message as a sink prints it (an ``error:`` or ``warning:`` line): ``str(text)`` redacted, control
    characters escaped (tabs and newlines kept: a message lctx wrote on several lines stays so), and cut to ``limit``
    characters with ``"... (N more characters left out)"``. The second line of defence behind :func:`quote`: a
    message that quoted outside text without it is still bounded, redacted and harmless to a terminal."""
    s = safe(str(text))
    if len(s) > limit:
        s = s[:limit] + f"... ({len(s) - limit} more characters left out)"
    return s


def quote_list(items, limit: int = 8, each: int = 80) -> str:
    """A list of outside names for a message: the first ``limit`` as :func:`quote` ``repr``-like strings of at
    most ``each`` characters, then ``"and N more"``."""
    items = list(items)
    shown = ", ".join(repr(quote(i, each)) for i in items[:limit])
    return shown + (f", and {len(items) - limit} more" if len(items) > limit else "")


def clean(value: Any, escape: bool = False) -> Any:
    """:func:`redact` (and with ``escape`` :func:`printable`) applied to every str of a JSON-like ``value`` (dict
    keys and values, lists, tuples), the structure kept; other values as they are. For a record or run.json before
    it is written (JSON itself escapes C0 controls, so a JSON sink needs no ``escape``)."""
    if isinstance(value, str):
        return safe(value) if escape else redact(value)
    if isinstance(value, dict):
        return {clean(k, escape): clean(v, escape) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v, escape) for v in value]
    if isinstance(value, tuple):
        return tuple(clean(v, escape) for v in value)
    return value
