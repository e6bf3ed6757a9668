"""The HTTP endpoint as an OAuth 2.1 resource server (MCP authorization; RFC 9728, RFC 6750).

`Validator.validate(token, resource)` checks a bearer JWT with PyJWT against the configured
issuers ([http.oauth] issuers): the header's `alg` must be in the allow-list (asymmetric
only: never `none`, never HS*), its `kid` is required and must name a key of the issuer's
JWKS (fetched with httpx, cached `jwks_ttl` seconds, refetched on an unknown `kid` at most
once per `jwks_min_refresh` seconds, so a rotated key is honoured and a flood of made-up kids
costs one fetch), the key's own algorithm must be the header's, `iss` must be that issuer,
`aud` the issuer's configured audience or else the endpoint's resource URL, and `exp`/`nbf`
hold with `leeway` seconds of clock skew (`exp`, `iss`, `aud` and `sub` are required).
The token's `sub`, `groups`/`roles` and `scope`/`scp` become an `OAuthIdentity`, which the
[[access]] rules' `oauth_*` keys match. Failures are `OAuthRejected` with a sentence for the
`error_description` of the 401.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import anyio
import httpx2
import jwt

from toolatlas.config import OAuthIssuer, OAuthSection
from toolatlas.gateway.ports import OAuthIdentity

log = logging.getLogger(__name__)

JWKS_TIMEOUT_S = 10.0
MAX_JWKS_BYTES = 256 * 1024
WELL_KNOWN = "/.well-known/oauth-protected-resource"


class OAuthRejected(Exception):
    """A bearer token that is not accepted; the message says why (no secret in it)."""


class Jwks:
    """One issuer's signing keys by `kid` (see the module docstring)."""

    def __init__(self, url: str, *, ttl: float, min_refresh: float) -> None:
        self.url, self.ttl, self.min_refresh = url, ttl, min_refresh
        self.keys: dict[str, jwt.PyJWK] = {}
        self.fetched_at = float("-inf")
        self.fetches = 0
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"<Jwks {self.url} kids={sorted(self.keys)} fetches={self.fetches}>"

    def _due(self, kid: str) -> bool:
        age = time.monotonic() - self.fetched_at
        return age >= self.ttl or (kid not in self.keys and age >= self.min_refresh)

    async def key(self, kid: str) -> jwt.PyJWK | None:
        """The key `kid` names, fetching the JWKS when it is stale or (rate-limited) when
        `kid` is unknown; None when the issuer does not publish it."""
        if self._due(kid):
            async with self._lock:  # one fetch for a burst of requests
                if self._due(kid):
                    await self._fetch()
        return self.keys.get(kid)

    async def _fetch(self) -> None:
        self.fetched_at = time.monotonic()  # a failing JWKS is not hammered either
        self.fetches += 1
        try:
            async with httpx2.AsyncClient(timeout=JWKS_TIMEOUT_S, follow_redirects=False) as client:
                response = await client.get(self.url, headers={"Accept": "application/json"})
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            if len(response.content) > MAX_JWKS_BYTES:
                raise ValueError(f"larger than {MAX_JWKS_BYTES} bytes")
            data = response.json()
            keys: dict[str, jwt.PyJWK] = {}
            for entry in data.get("keys", []) if isinstance(data, dict) else []:
                kid = entry.get("kid") if isinstance(entry, dict) else None
                if not isinstance(kid, str) or not kid or entry.get("kty") == "oct" or entry.get("use", "sig") != "sig":
                    continue  # no kid, a symmetric secret, or an encryption key: never used to verify
                try:
                    keys[kid] = jwt.PyJWK(entry)
                except jwt.PyJWTError as exc:
                    log.warning("JWKS %s: key %r skipped: %s", self.url, kid[:64], exc)
            self.keys = keys
        except (httpx2.HTTPError, ValueError, AttributeError, TypeError) as exc:
            log.warning("cannot fetch the JWKS %s (%s); keeping %d known key(s)", self.url, exc, len(self.keys))


def _names(value: Any) -> frozenset[str]:
    """A claim holding names: a list of strings, or one space-separated string."""
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(v for v in value if isinstance(v, str))
    return frozenset()


class Validator:
    """Accepts or rejects bearer JWTs for [http.oauth] (see the module docstring)."""

    def __init__(self, section: OAuthSection) -> None:
        self.section = section
        self.issuers: dict[str, tuple[OAuthIssuer, Jwks]] = {
            i.issuer: (i, Jwks(i.jwks_url, ttl=section.jwks_ttl, min_refresh=section.jwks_min_refresh))
            for i in section.issuers
        }

    @property
    def enabled(self) -> bool:
        return bool(self.issuers)

    def reconfigure(self, section: OAuthSection) -> None:
        """A reloaded [http.oauth]: issuers whose JWKS URL stayed keep their cached keys."""
        old = self.issuers
        self.section = section
        self.issuers = {}
        for i in section.issuers:
            kept = old.get(i.issuer)
            jwks = kept[1] if kept is not None and kept[1].url == i.jwks_url else Jwks(
                i.jwks_url, ttl=section.jwks_ttl, min_refresh=section.jwks_min_refresh)
            jwks.ttl, jwks.min_refresh = section.jwks_ttl, section.jwks_min_refresh
            self.issuers[i.issuer] = (i, jwks)

    def still_accepts(self, token: str, resource: str) -> bool:
        """Whether a token accepted before a reload still passes the current settings: its
        algorithm, its issuer, its key (known to the issuer's JWKS as cached now: a changed
        JWKS URL knows none yet) and its audience. Signature and times were checked as it came
        (a stream ends at its expiry anyway). Sync: a reload's sweep fetches nothing."""
        try:
            header, claims = jwt.get_unverified_header(token), jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return False
        iss, aud = claims.get("iss"), claims.get("aud")
        found = self.issuers.get(iss) if isinstance(iss, str) else None
        key = found[1].keys.get(str(header.get("kid"))) if found is not None else None
        if found is None or key is None or header.get("alg") not in self.section.algorithms:
            return False
        audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        return key.algorithm_name == header.get("alg") and (found[0].audience or resource) in audiences

    @staticmethod
    def looks_like_jwt(token: str) -> bool:
        return token.count(".") == 2

    async def validate(self, token: str, resource: str) -> OAuthIdentity:
        """The identity of a valid token for `resource` (the endpoint's URL); OAuthRejected."""
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise OAuthRejected("the token is not a well-formed JWT") from exc
        alg = header.get("alg")
        if alg not in self.section.algorithms:
            raise OAuthRejected(f"the token's algorithm {str(alg)[:20]!r} is not accepted "
                                f"(accepted: {', '.join(self.section.algorithms)})")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise OAuthRejected("the token has no key id (kid)")
        iss = unverified.get("iss")
        found = self.issuers.get(iss) if isinstance(iss, str) else None
        if found is None:
            raise OAuthRejected(f"the token's issuer {str(iss)[:200]!r} is not accepted")
        issuer, jwks = found
        key = await jwks.key(kid)
        if key is None:
            raise OAuthRejected(f"the key id {kid[:64]!r} is not in the issuer's JWKS")
        if key.algorithm_name != alg:
            raise OAuthRejected(f"the token's algorithm {alg!r} is not its key's ({key.algorithm_name})")
        try:
            claims = jwt.decode(token, key=key, algorithms=[alg], audience=issuer.audience or resource,
                                issuer=issuer.issuer, leeway=self.section.leeway,
                                options={"require": ["exp", "iss", "aud", "sub"]})
        except jwt.ExpiredSignatureError as exc:
            raise OAuthRejected("the token has expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise OAuthRejected("the token is not valid yet (nbf/iat in the future)") from exc
        except jwt.InvalidAudienceError as exc:
            raise OAuthRejected(f"the token's audience is not this resource ({issuer.audience or resource})") from exc
        except jwt.InvalidSignatureError as exc:
            raise OAuthRejected("the token's signature does not verify") from exc
        except jwt.PyJWTError as exc:
            raise OAuthRejected(f"the token is not accepted: {str(exc)[:200]}") from exc
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise OAuthRejected("the token has no subject (sub)")
        groups = _names(claims.get("groups")) | _names(claims.get("roles"))
        scopes = _names(claims.get("scope")) | _names(claims.get("scp"))
        exp = claims["exp"]  # required, and a number: PyJWT checked it
        return OAuthIdentity(issuer=issuer.issuer, subject=sub[:256], groups=groups, scopes=scopes,
                             expires_at=float(exp) + self.section.leeway)

    def metadata(self, resource: str) -> dict[str, Any]:
        """The Protected Resource Metadata (RFC 9728) of `resource`."""
        doc: dict[str, Any] = {
            "resource": resource,
            "authorization_servers": list(self.issuers),
            "bearer_methods_supported": ["header"],
            "resource_signing_alg_values_supported": list(self.section.algorithms),
        }
        if self.section.scopes_supported:
            doc["scopes_supported"] = list(self.section.scopes_supported)
        return doc


def metadata_url(origin: str, path: str) -> str:
    """The RFC 9728 metadata URL of the resource at `origin` + `path` (the well-known prefix
    inserted before the path)."""
    return origin.rstrip("/") + WELL_KNOWN + ("" if path in ("", "/") else path)


def challenge(metadata: str | None, error: str | None = None, description: str | None = None,
              scopes: Sequence[str] = ()) -> str:
    """A `WWW-Authenticate: Bearer ...` value (RFC 6750, RFC 9728 `resource_metadata`)."""
    parts = ['realm="toolatlas"']
    if metadata:
        parts.append(f'resource_metadata="{metadata}"')
    if error:
        parts.append(f'error="{error}"')
    if description:
        parts.append('error_description="' + description.replace('"', "'").replace("\\", "/")[:300] + '"')
    if scopes:
        parts.append(f'scope="{" ".join(scopes)}"')
    return "Bearer " + ", ".join(parts)


__all__ = ["Jwks", "OAuthRejected", "Validator", "WELL_KNOWN", "challenge", "metadata_url"]
