"""Secrets out of everything the daemon says: one `Redactor`, fed by `config.secrets(cfg)`.

The daemon has one, made from its config at start and grown by every reload (a secret the new
config dropped stays redacted: a late log line or a child's stderr may still quote it). It is
applied to every log line (`RedactingFormatter`, tracebacks included), every structured event,
catalog_status and the error messages clients get; card files use one made from their config.

All secrets are matched by one compiled alternation, longest first, so redacting a line costs
one regex pass however many secrets there are, and a secret containing another goes whole.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"
# What JSON (msgspec) writes escaped: a secret holding one of these is not in the encoded text as is.
_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')
# A header value "Scheme credential" (e.g. "Bearer abc...") also redacts the credential
# alone, since error messages often quote just the token; shorter ones are not worth it.
_MIN_BARE_CREDENTIAL = 8


class Redactor:
    """`redactor(text)` is `text` with every known secret replaced by `[REDACTED]`.

    Safe to call from any thread while another adds secrets (the pattern is swapped whole).
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: frozenset[str] = frozenset()
        self._pattern: re.Pattern[str] | None = None
        self._verbatim = True  # no secret holds a character JSON escapes
        self._lock = threading.Lock()
        self.add(secrets)

    def __len__(self) -> int:
        return len(self._secrets)

    def __repr__(self) -> str:
        return f"<Redactor secrets={len(self._secrets)}>"

    def add(self, secrets: Iterable[str]) -> None:
        """Redact these too from now on ("" is ignored)."""
        with self._lock:
            merged = set(self._secrets)
            for secret in secrets:
                if not secret:
                    continue
                merged.add(secret)
                parts = secret.split()
                if len(parts) > 1 and len(parts[-1]) >= _MIN_BARE_CREDENTIAL:
                    merged.add(parts[-1])
            if merged == self._secrets:
                return
            ordered = sorted(merged, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered)))
            self._verbatim = not any(_JSON_ESCAPED.search(secret) for secret in merged)
            self._secrets = frozenset(merged)

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        return text if pattern is None else pattern.sub(REDACTED, text)

    def absent_from_json(self, text: str) -> bool:
        """Whether no secret is in any key or string of the JSON document `text`: true when
        none is in `text` itself and no secret holds a character JSON writes escaped (a
        quote, a backslash, a control character), since a string holding such a secret
        holds it unchanged in its JSON form. One pass over the document instead of one per
        string; False means only that the strings must be redacted one by one."""
        pattern = self._pattern
        if pattern is None:
            return True
        return self._verbatim and pattern.search(text) is None

    def tree(self, value: Any) -> Any:
        """`value` with every string in it (mapping keys too) redacted; other values as they are."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {self(k) if isinstance(k, str) else k: self.tree(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.tree(v) for v in value]
        return value

    def exception(self, exc: BaseException) -> BaseException:
        """`exc` with its message redacted in place (for errors whose text reaches a client)."""
        if self._pattern is not None:
            exc.args = tuple(self(a) if isinstance(a, str) else a for a in exc.args)
        return exc


class RedactingFormatter(logging.Formatter):
    """A formatter whose every formatted line (message, arguments, traceback) is redacted."""

    def __init__(self, redactor: Redactor, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor(super().format(record))


__all__ = ["REDACTED", "RedactingFormatter", "Redactor"]
