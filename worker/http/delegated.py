"""An authorization server's side of end users' tokens: its metadata (RFC 8414 / OpenID discovery), the
authorization code grant with PKCE (RFC 7636), refresh (RFC 6749 §6), token exchange (RFC 8693) and
revocation (RFC 7009).

Every request goes through the transport like the client-credentials one (oauth.py): never redirected,
no secret (code, verifier, refresh or subject token, client secret) in an error message. A grant the
server refuses (HTTP 400/401, `invalid_grant` and the like) is AuthorizationRequired (67): the user must
connect again.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from yarl import URL

from worker import errors
from worker.http.oauth import TokenRequest, post_form
from worker.http.transport import HttpTransport, Limits, PoolSpec, PreparedRequest

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
_MAX_METADATA_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ServerEndpoints:
    """Where an authorization server takes each request; `issuer` is None when configured by hand."""

    authorization_url: str
    token_url: str
    revocation_url: str | None = None
    issuer: str | None = None


@dataclass(frozen=True, slots=True)
class Issued:
    """A token response: the access token, maybe a refresh token, its lifetime, the scopes granted."""

    access_token: str
    refresh_token: str | None
    expires_in_s: float | None
    scopes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pkce:
    verifier: str
    challenge: str

    @classmethod
    def new(cls) -> Pkce:
        verifier = secrets.token_urlsafe(48)
        digest = hashlib.sha256(verifier.encode()).digest()
        return cls(verifier, base64.urlsafe_b64encode(digest).decode().rstrip("="))


def metadata_urls(issuer: str) -> list[str]:
    """RFC 8414 (the well-known path before the issuer's own path), then OpenID discovery (after it)."""
    parts = urlsplit(issuer.rstrip("/"))
    origin = f"{parts.scheme}://{parts.netloc}"
    return [
        f"{origin}/.well-known/oauth-authorization-server{parts.path}",
        f"{origin}{parts.path}/.well-known/openid-configuration",
    ]


async def discover(transport: HttpTransport, issuer: str, timeout_s: float, verify_tls: bool) -> ServerEndpoints:
    """The issuer's endpoints from its metadata, which must name the same issuer; UpstreamUnavailable (69)
    when the server cannot be reached, ToolMisconfigured (78) when neither document answers with them."""
    reached = False
    for url in metadata_urls(issuer):
        answered, response = await _get(transport, url, timeout_s, verify_tls)
        reached = reached or answered
        if response is None:
            continue
        named, auth_url, token_url = (response.get(k) for k in ("issuer", "authorization_endpoint", "token_endpoint"))
        if (
            str(named).rstrip("/") != issuer.rstrip("/")
            or not isinstance(auth_url, str)
            or not isinstance(token_url, str)
        ):
            raise errors.ToolMisconfigured(
                "The authorization server's metadata names another issuer. Tell the operator."
            )
        revocation = response.get("revocation_endpoint")
        return ServerEndpoints(auth_url, token_url, revocation if isinstance(revocation, str) else None, str(named))
    if not reached:
        raise errors.UpstreamUnavailable("The authorization server cannot be reached. Try again later.")
    raise errors.ToolMisconfigured("The authorization server publishes no metadata. Tell the operator.")


async def _get(
    transport: HttpTransport, url: str, timeout_s: float, verify_tls: bool
) -> tuple[bool, dict[str, object] | None]:
    """Whether the server answered at all, and the JSON object it answered 200 with."""
    origin = URL(url, encoded=True).origin()
    request = PreparedRequest("GET", url, (("Accept", "application/json"),), None, frozenset(), frozenset())
    spec = PoolSpec(f"(token) {origin}", verify_tls, 4, timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            response = await transport.send(request, spec, Limits(_MAX_METADATA_BYTES, timeout_s), _no_redirect, origin)
    except (TimeoutError, errors.TransportError):
        return False, None
    except errors.ToolError:  # a redirect, a malformed URL: it answered, unusably
        return True, None
    try:
        data = json.loads(response.body) if response.status == 200 else None
    except ValueError:
        data = None
    return response.status < 500, data if isinstance(data, dict) else None


def _no_redirect(target: URL) -> None:
    raise errors.ToolMisconfigured("The authorization server answered with a redirect. Tell the operator.")


def authorization_url(
    endpoints: ServerEndpoints,
    client_id: str,
    redirect_uri: str,
    scopes: tuple[str, ...],
    state: str,
    pkce: Pkce,
    extra: Mapping[str, str],
) -> str:
    """Where the user's browser goes to grant access (PKCE S256 always)."""
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": pkce.challenge,
        "code_challenge_method": "S256",
        **({"scope": " ".join(scopes)} if scopes else {}),
        **extra,
    }
    separator = "&" if "?" in endpoints.authorization_url else "?"
    return endpoints.authorization_url + separator + urlencode(query)


class ClientRejected(errors.AuthorizationRequired):
    """The token endpoint does not know (or no longer accepts) the client: `invalid_client`."""


async def grant(transport: HttpTransport, request: TokenRequest) -> Issued:
    """A token request (code, refresh, token exchange); AuthorizationRequired when the server refuses it."""
    response = await post_form(transport, request)
    if response.status in (400, 401, 403):
        kind = _error_code(response.body)
        failure = ClientRejected if kind == "invalid_client" else errors.AuthorizationRequired
        raise failure(f"The authorization server refused the grant ({kind}).")
    try:
        data = json.loads(response.body)
        access_token = data["access_token"]
        expires_in = data.get("expires_in")
        scope = data.get("scope") or ""
    except (ValueError, KeyError, TypeError):
        data, access_token = None, None
    if response.status != 200 or not isinstance(access_token, str) or not access_token or data is None:
        raise errors.ToolMisconfigured(
            f"The authorization server answered without an access token (HTTP {response.status}). Tell the operator."
        )
    refresh = data.get("refresh_token")
    lifetime = float(expires_in) if isinstance(expires_in, (int, float)) and expires_in > 0 else None
    scopes = tuple(scope.split()) if isinstance(scope, str) else ()
    return Issued(access_token, refresh if isinstance(refresh, str) and refresh else None, lifetime, scopes)


async def revoke(transport: HttpTransport, request: TokenRequest) -> bool:
    """RFC 7009: True when the server took the revocation (it answers 200 for a token it does not know)."""
    try:
        response = await post_form(transport, request)
    except errors.ToolError:
        return False
    return response.status == 200


def _error_code(body: bytes) -> str:
    try:
        code = json.loads(body).get("error")
    except (ValueError, AttributeError):
        code = None
    return code if isinstance(code, str) and code.replace("_", "").isalnum() else "refused"


def expiry(issued: Issued, sent_at: float) -> float:
    """When an issued access token expires (0: nobody says). Its lifetime runs from when the token request
    was sent (the server issued it after that, never before), and ends no later than the token's own `exp`
    when it is a JWT: that is the clock the upstream checks, in whole seconds."""
    lifetime = None if issued.expires_in_s is None else sent_at + issued.expires_in_s
    stamped = jwt_expiry(issued.access_token)
    known = [at for at in (lifetime, stamped) if at is not None]
    return min(known) if known else 0.0


def jwt_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT access token, read without checking its signature (only to know when the
    upstream will refuse it); None for an opaque token or one without `exp`."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, TypeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) and exp > 0 else None
