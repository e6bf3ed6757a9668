"""The gateway's own `requestState` for input_required passthrough (MCP 2026-07-28).

When an upstream answers a tools/call with `input_required` (it needs an elicitation or a
sample from the user), the gateway passes the input requests to its client and hands out a
state token of its own: the upstream's state sealed (AES-256-GCM, cryptography's AEAD) together
with the upstream, the tool, the caller and an expiry. The client's retry must bring it back;
a token that was tampered with, belongs to another caller or tool, has expired, or was
already used is refused, so a client cannot forge or replay an upstream's state.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
import time
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from toolatlas.errors import BadInput

DEFAULT_TTL_S = 600.0


class InputStateSealer:
    """Seals and checks gateway request states; each token is good for one retry."""

    def __init__(self, *, ttl: float = DEFAULT_TTL_S, key: bytes | None = None) -> None:
        self.ttl = ttl
        self._aead = AESGCM(key or os.urandom(32))
        self._used: dict[str, float] = {}  # nonce -> expiry
        self._lock = threading.Lock()

    def seal(self, *, upstream: str, tool: str, principal: str, upstream_state: str | None,
             park: str | None = None) -> str:
        """A token for one retry; `park` names a call the gateway keeps waiting for the answer
        (a 2025-era upstream's question, see gateway.exchange)."""
        payload = {
            "u": upstream, "t": tool, "p": principal, "e": time.time() + self.ttl,
            "n": os.urandom(12).hex(), "s": upstream_state, "k": park,
        }
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, json.dumps(payload, separators=(",", ":")).encode(), None)
        return base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def _unseal(self, token: str) -> bytes:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        if len(raw) < 12 + 16:
            raise ValueError("token too short")
        return self._aead.decrypt(raw[:12], raw[12:], None)

    def open(self, token: str, *, tool: str, principal: str) -> tuple[str, str | None]:
        """(upstream, upstream state) for a retry of `tool` by `principal`; BadInput if refused."""
        upstream, state, _park = self.open_parked(token, tool=tool, principal=principal)
        return upstream, state

    def release(self, token: str) -> None:
        """Make a token opened by `open_parked` good for one more retry: the retry it came
        with was refused before it reached the call (its answer was missing)."""
        try:
            nonce = str(json.loads(self._unseal(token)).get("n"))
        except (InvalidTag, binascii.Error, ValueError, TypeError, AttributeError):
            return
        with self._lock:
            self._used.pop(nonce, None)

    def open_parked(self, token: str, *, tool: str, principal: str) -> tuple[str, str | None, str | None]:
        """`open`, and the key of the parked call the token answers (None if none)."""
        try:
            payload: dict[str, Any] = json.loads(self._unseal(token))
        except (InvalidTag, binascii.Error, ValueError, TypeError) as exc:
            raise BadInput(
                "requestState was not issued by this gateway or was altered; call the tool again without it"
            ) from exc
        if payload.get("t") != tool:
            raise BadInput(f"requestState belongs to another tool call, not {tool!r}; call the tool again without it")
        if payload.get("p") != principal:
            raise BadInput("requestState belongs to another caller; call the tool again without it")
        now = time.time()
        if float(payload.get("e", 0)) < now:
            raise BadInput("requestState has expired; call the tool again without it")
        nonce = str(payload.get("n"))
        with self._lock:
            for n, exp in list(self._used.items()):
                if exp < now:
                    del self._used[n]
            if nonce in self._used:
                raise BadInput("requestState was already used; each one is good for a single retry")
            self._used[nonce] = float(payload["e"])
        return str(payload["u"]), payload.get("s"), payload.get("k")
