"""A local OAuth issuer for tests: real RS256 and ES256 keys (cryptography), a JWKS served on
127.0.0.1 by a thread, and tokens signed with PyJWT. `rotate()` publishes a new key beside
(or instead of) the old ones, as an authorization server does when it rotates."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support.listener import RecordingListener


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class LocalIssuer:
    """`issuer` is its URL and `jwks_url` serves the published keys (both set on entering: a
    RecordingListener on 127.0.0.1 answers); `fetches` counts JWKS GETs."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[str, Any]] = {}  # kid -> (alg, private key)
        self.published: list[str] = []
        self.issuer = self.jwks_url = ""
        self._listener: RecordingListener | None = None

    @property
    def fetches(self) -> int:
        """JWKS requests served so far."""
        return len(self._listener.hits) if self._listener is not None else 0

    def __enter__(self) -> "LocalIssuer":
        self._listener = RecordingListener(lambda: json.dumps(self.jwks()).encode())
        self.issuer = self._listener.url
        self.jwks_url = f"{self.issuer}/jwks.json"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._listener is not None:
            self._listener.close()

    def add_key(self, kid: str, alg: str = "RS256", *, publish: bool = True) -> None:
        key: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048) if alg.startswith("RS") \
            else ec.generate_private_key(ec.SECP256R1())
        self.keys[kid] = (alg, key)
        if publish:
            self.published.append(kid)

    def rotate(self, new_kid: str, alg: str = "RS256", *, drop: list[str] | None = None) -> None:
        self.add_key(new_kid, alg)
        for kid in drop or []:
            self.published.remove(kid)

    def jwks(self) -> dict[str, Any]:
        out = []
        for kid in self.published:
            alg, key = self.keys[kid]
            jwk = json.loads(jwt.algorithms.get_default_algorithms()[alg].to_jwk(key.public_key()))
            out.append({**jwk, "kid": kid, "use": "sig", "alg": alg})
        return {"keys": out}

    def public_pem(self, kid: str) -> bytes:
        return self.keys[kid][1].public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def claims(self, audience: str, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        return {"iss": self.issuer, "sub": "alice", "aud": audience, "iat": now, "nbf": now, "exp": now + 600,
                **extra}

    def token(self, kid: str, claims: dict[str, Any], *, headers: dict[str, Any] | None = None) -> str:
        alg, key = self.keys[kid]
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid, **(headers or {})})

    @staticmethod
    def unsigned(claims: dict[str, Any], kid: str) -> str:
        """An `alg: none` token (no signature)."""
        head = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
        return f"{head}.{_b64(json.dumps(claims).encode())}."

    def hs256_with_public_key(self, claims: dict[str, Any], kid: str) -> str:
        """The algorithm-confusion attack: HS256 keyed with the issuer's public key."""
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
        body = _b64(json.dumps(claims).encode())
        sig = hmac.new(self.public_pem(kid), f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{_b64(sig)}"
