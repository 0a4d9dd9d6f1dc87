"""Asking the human behind an MCP client, through the protocol, before a call goes on.

What the client can do decides how:

    2026-07-28            an `input_required` result carrying the request; the client retries the call
                          with the human's answer in `inputResponses` (read here on the retry)
    2025-11-25 and before `elicitation/create` on the request's back-channel (stdio) where the client
                          declared the mode; over stateless HTTP, where neither a back-channel nor the
                          handshake's capabilities reach the request, the -32042 error (URL elicitation
                          required, the URL in its data and its message), and the client calls again
    neither               Answer("unsupported"): the caller says in its tool error what the human must do

`ask_to_visit` sends the human to a URL (URL mode: a consent page that must not pass through the client).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import NoBackChannelError, UrlElicitationRequiredError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

Context = ServerRequestContext[Any, Any]
Action = Literal["accept", "decline", "cancel", "pending", "unsupported"]
INPUT_RESPONSES_KEY = "inputResponses"


@dataclass(frozen=True)
class Answer:
    """The human's answer; `pending`: the result to return now (input_required), the answer comes on the
    call's retry."""

    action: Action
    result: Mapping[str, Any] | None = field(default=None)

    @property
    def accepted(self) -> bool:
        return self.action == "accept"


async def ask_to_visit(ctx: Context, message: str, url: str, key: str | None = None) -> Answer:
    """Ask the human to open `url` (and say when done); `key` names the question across a retry."""
    key = key or "visit-" + hashlib.sha256(url.encode()).hexdigest()[:16]
    if ctx.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return _input_required(ctx, message, url, key)
    if ctx.session.client_capabilities is None and ctx.request is not None:  # stateless HTTP
        raise _url_required(message, url, key)
    if not _declared_url_mode(ctx):
        return Answer("unsupported")
    try:
        result = await ctx.session.elicit_url(message, url, key)
    except NoBackChannelError:  # the client is told to visit the URL and call again
        raise _url_required(message, url, key) from None
    return Answer(result.action)


def _url_required(message: str, url: str, key: str) -> UrlElicitationRequiredError:
    params = types.ElicitRequestURLParams(mode="url", message=message, url=url, elicitation_id=key)
    return UrlElicitationRequiredError([params], f"{message} {url}")


def answered(ctx: Context, key_prefix: str) -> Answer | None:
    """On a 2026-07-28 retry: the answer given to a question whose key starts with `key_prefix`."""
    responses = (ctx.params or {}).get(INPUT_RESPONSES_KEY)
    if not isinstance(responses, Mapping):
        return None
    for key, response in responses.items():
        if isinstance(key, str) and key.startswith(key_prefix) and isinstance(response, Mapping):
            action = response.get("action")
            return Answer(action if action in ("accept", "decline", "cancel") else "cancel")
    return None


def _input_required(ctx: Context, message: str, url: str, key: str) -> Answer:
    if not _declared_url_mode(ctx):
        return Answer("unsupported")
    request = {"method": "elicitation/create", "params": {"mode": "url", "message": message, "url": url}}
    return Answer("pending", {"resultType": "input_required", "inputRequests": {key: request}})


def _declared_url_mode(ctx: Context) -> bool:
    capabilities = ctx.session.client_capabilities
    elicitation = getattr(capabilities, "elicitation", None)
    return elicitation is not None and getattr(elicitation, "url", None) is not None
