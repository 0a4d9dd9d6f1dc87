"""The gateway as an OAuth 2.1 resource server: access tokens (JWT) from one authorization server.

A token is accepted when its signature verifies with one of the issuer's keys (its JWKS, found from the
issuer's metadata: RFC 8414 `/.well-known/oauth-authorization-server`, else OpenID discovery), with an
algorithm the access file allows (asymmetric only: never `none`, never HS* keyed by a public key), and
its `iss` is the issuer, its `aud` the gateway's resource (RFC 8707), `exp`/`nbf` within a small leeway.
PyJWT does the JOSE work; the keys are fetched in a thread (its client is synchronous) and kept, and a
token naming a key not among them (the issuer rotated) fetches them again, at most once per
`jwks_refetch_min_seconds`. The claims then name the principal, its tenant, and (by its scopes) its grant.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import jwt
import structlog
from jwt import PyJWK, PyJWKClient, PyJWKSet
from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.routes import build_resource_metadata_url
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.routing import Route

from worker.constants import DEFAULT_TENANT, TENANT_PATTERN
from worker.gateway.identity.principals import NOTHING, Grant, OAuthSpec, Principal

log = structlog.get_logger("toolworker.gateway.oauth")
_REQUIRED_CLAIMS = ["exp", "iss", "aud"]
# Tokens already verified, kept until they expire (at most this long): an agent sends the same token with
# every call, and a signature check is most of what a token costs the gateway.
VERIFIED_MAX_AGE_S = 300.0
VERIFIED_MAX_TOKENS = 4096
WELL_KNOWN_RESOURCE_PATH = "/.well-known/oauth-protected-resource"


class InvalidToken(Exception):
    """An access token the gateway does not accept; the message says why (never the token)."""


class IssuerUnavailable(InvalidToken):
    """The issuer's metadata or keys could not be fetched."""


def metadata_urls(issuer: str) -> list[str]:
    """Where the issuer's metadata is: RFC 8414 (the well-known path before the issuer's own path), then
    OpenID Connect Discovery (after it)."""
    parts = urlsplit(issuer.rstrip("/"))
    origin = f"{parts.scheme}://{parts.netloc}"
    return [
        f"{origin}/.well-known/oauth-authorization-server{parts.path}",
        f"{origin}{parts.path}/.well-known/openid-configuration",
    ]


def _fetch_json(url: str, timeout_s: float) -> Any:
    # PyJWKClient's fetch: a JSON object over HTTP(S), redirects refused, errors as PyJWKClientError.
    return PyJWKClient(url, cache_jwk_set=False, timeout=int(max(1, timeout_s))).fetch_data()


class IssuerKeys:
    """The issuer's signing keys, discovered from its metadata and kept; refetched on an unknown `kid`."""

    def __init__(self, spec: OAuthSpec) -> None:
        self._spec = spec
        self._jwks_uri: str | None = None
        self.issuer = spec.issuer  # as the metadata spells it, once read
        self._keys: PyJWKSet | None = None
        self._fetched_at = -float("inf")
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def key(self, kid: str | None) -> PyJWK:
        """The key that signed a token (by its `kid`); raises InvalidToken when the issuer has none such,
        IssuerUnavailable while its keys could never be fetched (tried again at most once an interval)."""
        if self._keys is None:
            await self._refresh(min_age_s=self._spec.jwks_refetch_min_seconds)
        elif time.monotonic() - self._fetched_at > self._spec.jwks_max_age_seconds:
            await self._refresh(min_age_s=0.0)
        if self._keys is None:
            raise IssuerUnavailable("The authorization server's keys cannot be fetched.")
        found = self._find(kid)
        if found is None:
            await self._refresh(min_age_s=self._spec.jwks_refetch_min_seconds)
            found = self._find(kid)
        if found is None:
            raise InvalidToken("The token is signed by a key the issuer does not publish.")
        return found

    def _find(self, kid: str | None) -> PyJWK | None:
        keys = [k for k in (self._keys.keys if self._keys else []) if k.public_key_use in (None, "sig")]
        if kid is None:  # without a kid, only an issuer with a single key is unambiguous
            return keys[0] if len(keys) == 1 else None
        return next((k for k in keys if k.key_id == kid), None)

    async def _refresh(self, min_age_s: float) -> None:
        async with self._lock:  # the requests that meet an unknown kid together share one fetch
            if time.monotonic() - self._fetched_at < min_age_s:
                return
            try:
                self._keys = await asyncio.to_thread(self._fetch)
            except (jwt.PyJWKClientError, jwt.PyJWKSetError, ValueError) as exc:  # the keys kept (if any) serve on
                log.warning("gateway.jwks_unavailable", issuer=self._spec.issuer, error=str(exc))
            self._fetched_at = time.monotonic()  # a failure too: an issuer that is down is not asked every request
            self.fetches += 1

    def _fetch(self) -> PyJWKSet:
        timeout_s = self._spec.fetch_timeout_seconds
        if self._jwks_uri is None:
            self._jwks_uri, self.issuer = _discover(self._spec.issuer, timeout_s)
        keys = PyJWKClient(self._jwks_uri, cache_jwk_set=False, timeout=int(max(1, timeout_s))).get_jwk_set()
        log.info("gateway.jwks_fetched", issuer=self.issuer, kids=[k.key_id for k in keys.keys])
        return keys


def _discover(issuer: str, timeout_s: float) -> tuple[str, str]:
    """The issuer's `jwks_uri` and its `issuer` as its metadata spells it (which must be the one configured)."""
    problems = []
    for url in metadata_urls(issuer):
        try:
            metadata = _fetch_json(url, timeout_s)
        except jwt.PyJWKClientError as exc:
            problems.append(f"{url}: {exc}")
            continue
        named, jwks_uri = str(metadata.get("issuer", "")), metadata.get("jwks_uri")
        if named.rstrip("/") != issuer.rstrip("/") or not isinstance(jwks_uri, str):
            raise ValueError(f"{url} names another issuer ({named!r}) or no jwks_uri")
        return jwks_uri, named
    raise ValueError("no metadata: " + "; ".join(problems))


class JwtVerifier:
    """Access tokens of the access file's `oauth:` issuer, for the gateway's resource (`audience`)."""

    def __init__(self, spec: OAuthSpec, audience: str, keys: IssuerKeys | None = None) -> None:
        self.spec = spec
        self.audience = audience
        self.keys = keys or IssuerKeys(spec)
        self._verified: dict[str, tuple[Principal, float]] = {}

    async def principal(self, token: str) -> Principal:
        """The principal of a valid token; raises InvalidToken."""
        known = self._verified.get(token)
        if known is not None and time.time() < known[1]:
            return known[0]
        claims = await self.claims(token)
        principal = self.principal_of(claims)
        self._remember(token, principal, min(float(claims["exp"]), time.time() + VERIFIED_MAX_AGE_S))
        return principal

    def _remember(self, token: str, principal: Principal, until_s: float) -> None:
        if len(self._verified) >= VERIFIED_MAX_TOKENS:  # the oldest goes (dicts keep insertion order)
            self._verified.pop(next(iter(self._verified)))
        self._verified[token] = (principal, until_s)

    async def claims(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise InvalidToken("The token is not a JWT.") from None
        if header.get("alg") not in self.spec.algorithms:
            raise InvalidToken("The token's signature algorithm is not accepted.")
        key = await self.keys.key(header.get("kid"))
        try:
            return jwt.decode(
                token,
                key,
                algorithms=self.spec.algorithms,
                audience=self.audience,
                issuer=self.keys.issuer,
                leeway=self.spec.leeway_seconds,
                options={"require": _REQUIRED_CLAIMS},
            )
        except jwt.InvalidTokenError as exc:
            raise InvalidToken(f"The token is not valid: {exc}.") from None

    def principal_of(self, claims: Mapping[str, Any]) -> Principal:
        name = claims.get(self.spec.principal_claim)
        if not isinstance(name, str) or not name:
            raise InvalidToken(f"The token has no `{self.spec.principal_claim}` claim.")
        return Principal(name[:256], self._tenant(claims), self.grant(scopes(claims)))

    def grant(self, granted: set[str]) -> Grant:
        grant = NOTHING
        for scope in sorted(granted & self.spec.scopes.keys()):
            grant = grant | self.spec.scopes[scope].grant()
        return grant

    def _tenant(self, claims: Mapping[str, Any]) -> str:
        claim = self.spec.tenant_claim
        tenant = claims.get(claim) if claim else None
        if tenant is None:
            return DEFAULT_TENANT
        if not isinstance(tenant, str) or not re.fullmatch(TENANT_PATTERN, tenant):
            raise InvalidToken(f"The token's `{claim}` claim is not a tenant name.")
        return tenant


def scopes(claims: Mapping[str, Any]) -> set[str]:
    """The token's scopes: `scope` (space-separated, RFC 9068) or `scp` (a list, as some issuers write)."""
    scope, scp = claims.get("scope"), claims.get("scp")
    found = set(scope.split()) if isinstance(scope, str) else set()
    if isinstance(scp, list):
        found.update(s for s in scp if isinstance(s, str))
    return found


def protected_resource_routes(resource: str, spec: OAuthSpec) -> list[Route]:
    """Protected Resource Metadata (RFC 9728) at the well-known path and at its form suffixed with the
    resource's path (`/mcp`), as the MCP SDK's handler answers it: where an MCP client finds the issuer."""
    # Validated from text, so that the URLs stay as written (a client compares the issuer exactly with the
    # one its metadata names: `http://idp` is not `http://idp/`).
    metadata = ProtectedResourceMetadata.model_validate(
        {
            "resource": resource,
            "authorization_servers": [spec.issuer],
            "scopes_supported": sorted(spec.scopes) or None,
            "resource_name": "toolworker",
        }
    )
    handler = ProtectedResourceMetadataHandler(metadata).handle
    suffixed = urlsplit(str(build_resource_metadata_url(AnyHttpUrl(resource)))).path
    paths = dict.fromkeys([WELL_KNOWN_RESOURCE_PATH, suffixed])
    return [Route(path, handler, methods=["GET"]) for path in paths]


def resource_metadata_url(resource: str) -> str:
    return str(build_resource_metadata_url(AnyHttpUrl(resource)))
