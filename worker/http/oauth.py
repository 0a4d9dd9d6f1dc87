"""The token request of OAuth 2.0's client-credentials grant (RFC 6749 §4.4), with errors mapped for the model.

The token URL is trusted configuration, like a base URL. The request goes through the transport (its
pools, its resolver, no cookies) and is never redirected: the client secret goes to the token URL and
nowhere else. Neither the client secret nor a token appears in an error message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

import aiohttp
from yarl import URL

from worker import errors
from worker.http.transport import HttpTransport, Limits, PoolSpec, PreparedRequest, Response

_MAX_TOKEN_RESPONSE_BYTES = 64 * 1024
# Form fields whose values are secrets (kept out of errors and logs like the client secret).
SECRET_FORM_FIELDS = frozenset({"client_secret", "code", "code_verifier", "refresh_token", "subject_token", "token"})
# Token requests are one per token lifetime for the whole fleet: a small pool per token endpoint.
_TOKEN_POOL_CONNECTIONS = 4


@dataclass(frozen=True, slots=True)
class TokenRequest:
    url: str
    form: Mapping[str, str]  # grant_type, scope, audience, extra parameters, and the client's own if in the body
    basic: tuple[str, str] | None  # (client_id, client_secret) when the client authenticates with HTTP Basic
    timeout_s: float
    verify_tls: bool


@dataclass(frozen=True, slots=True)
class Token:
    access_token: str
    expires_in_s: float


async def fetch_token(transport: HttpTransport, request: TokenRequest, default_lifetime_s: float = 3600.0) -> Token:
    """One token request; UpstreamUnavailable (69) when the endpoint cannot answer, ToolMisconfigured (78)
    when it refuses the client, redirects, or answers without a token."""
    return _token(await post_form(transport, request), default_lifetime_s)


async def post_form(transport: HttpTransport, request: TokenRequest) -> Response:
    """A form POST to an authorization server's endpoint (never redirected); UpstreamUnavailable (69) when
    it cannot answer (5xx, 429, no connection), the response otherwise."""
    origin = URL(request.url, encoded=True).origin()
    spec = PoolSpec(f"(token) {origin}", request.verify_tls, _TOKEN_POOL_CONNECTIONS, request.timeout_s)
    limits = Limits(_MAX_TOKEN_RESPONSE_BYTES, request.timeout_s)
    try:
        async with asyncio.timeout(request.timeout_s):
            response = await transport.send(_prepared(request), spec, limits, _refuse_redirect, origin)
    except errors.MalformedURL:
        raise errors.ToolMisconfigured("The upstream's token URL is malformed. Tell the operator.") from None
    except (TimeoutError, errors.TransportError):
        raise errors.UpstreamUnavailable(
            "The upstream's token endpoint could not be reached, so the call was not sent. Try again later."
        ) from None
    if response.status >= 500 or response.status == 429:
        raise errors.UpstreamUnavailable(
            f"The upstream's token endpoint is unavailable (HTTP {response.status}), so the call was not sent. "
            "Try again later."
        )
    return response


def _prepared(request: TokenRequest) -> PreparedRequest:
    headers = [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")]
    secrets = {value for name, value in request.form.items() if name in SECRET_FORM_FIELDS}
    if request.basic:
        headers.append(("Authorization", aiohttp.encode_basic_auth(*request.basic)))
        secrets.add(request.basic[1])
    body = urlencode(dict(request.form)).encode()
    return PreparedRequest("POST", request.url, tuple(headers), body, frozenset(secrets), frozenset({"authorization"}))


def _refuse_redirect(target: URL) -> None:
    raise errors.ToolMisconfigured(
        "The upstream's token endpoint answered with a redirect; the client credentials were not sent on. "
        "Tell the operator."
    )


def _token(response: Response, default_lifetime_s: float) -> Token:
    if response.status >= 400:
        raise errors.ToolMisconfigured(
            f"The upstream's token endpoint refused this tool's client credentials (HTTP {response.status}). "
            "Tell the operator."
        )
    try:
        data = json.loads(response.body)
        access_token = data["access_token"]
        expires_in = float(data.get("expires_in") or default_lifetime_s)
    except (ValueError, KeyError, TypeError):
        raise errors.ToolMisconfigured(
            "The upstream's token endpoint answered without an access token. Tell the operator."
        ) from None
    if not isinstance(access_token, str) or not access_token or expires_in <= 0:
        raise errors.ToolMisconfigured("The upstream's token endpoint answered with an unusable token.")
    return Token(access_token, expires_in)
