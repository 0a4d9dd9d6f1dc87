"""The token request of OAuth 2.0's client-credentials grant (RFC 6749 §4.4), with errors mapped for the model.

The token URL is trusted configuration, like a base URL. Neither the client secret nor a token appears in
an error message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from worker import errors

_MAX_TOKEN_RESPONSE_BYTES = 64 * 1024


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


async def fetch_token(request: TokenRequest, default_lifetime_s: float = 3600.0) -> Token:
    """One token request; UpstreamUnavailable (69) when the endpoint cannot answer, ToolMisconfigured (78)
    when it refuses the client or answers without a token."""
    headers = {"Authorization": aiohttp.encode_basic_auth(*request.basic)} if request.basic else {}
    timeout = aiohttp.ClientTimeout(total=request.timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()) as session,
            session.post(request.url, data=dict(request.form), headers=headers, ssl=request.verify_tls) as response,
        ):
            body = await response.content.read(_MAX_TOKEN_RESPONSE_BYTES)
            status = response.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        raise errors.UpstreamUnavailable(
            "The upstream's token endpoint could not be reached, so the call was not sent. Try again later."
        ) from None
    if status >= 500 or status == 429:
        raise errors.UpstreamUnavailable(
            f"The upstream's token endpoint is unavailable (HTTP {status}), so the call was not sent. Try again later."
        )
    return _token(status, body, default_lifetime_s)


def _token(status: int, body: bytes, default_lifetime_s: float) -> Token:
    if status >= 400:
        raise errors.ToolMisconfigured(
            f"The upstream's token endpoint refused this tool's client credentials (HTTP {status}). Tell the operator."
        )
    try:
        data = json.loads(body)
        access_token = data["access_token"]
        expires_in = float(data.get("expires_in") or default_lifetime_s)
    except (ValueError, KeyError, TypeError):
        raise errors.ToolMisconfigured(
            "The upstream's token endpoint answered without an access token. Tell the operator."
        ) from None
    if not isinstance(access_token, str) or not access_token or expires_in <= 0:
        raise errors.ToolMisconfigured("The upstream's token endpoint answered with an unusable token.")
    return Token(access_token, expires_in)
