"""Asking the human behind an MCP client, through the protocol, before a call goes on: a yes/no question
(form mode: a call that needs approval) or a page to visit (URL mode: consent to act for the user, a page
that must not pass through the client).

    2026-07-28            an `input_required` result carrying the question; the client asks its human and
                          sends the request again with the answer in `inputResponses`, read here on that
                          retry. Nothing is kept between the rounds, so the second may reach another gateway.
    2025-11-25 and before `elicitation/create` on the request's back-channel where the client declared
                          elicitation: stdio, or over HTTP the `tools/call`'s own event stream, the answer
                          coming back through Redis from whichever process it is POSTed to (sessions.py,
                          back_channel.py). A request over HTTP without a session (capabilities unknown)
                          gets the -32042 error (URL elicitation required, the URL in its data and message).
    neither               Answer("unsupported"): the caller says in its tool error what the human can do
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import NoBackChannelError, UrlElicitationRequiredError
from mcp_types.version import is_version_at_least
from starlette.requests import Request

from worker.gateway.mcp.sessions import handshake_of

Context = ServerRequestContext[Any, Any]
Action = Literal["accept", "decline", "cancel", "pending", "unsupported"]
INPUT_REQUIRED_VERSION = "2026-07-28"
INPUT_RESPONSES_KEY = "inputResponses"
# A question whose answer is the action alone (accept, decline or cancel): an empty form.
CONFIRM_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
_ANSWERS = ("accept", "decline", "cancel")


@dataclass(frozen=True)
class Answer:
    """The human's answer; `pending`: `result` is the question to answer the request with now (2026-07-28),
    the answer comes with the request's retry; `unsupported`: this client cannot be asked."""

    action: Action
    result: Mapping[str, Any] | None = None

    @property
    def accepted(self) -> bool:
        return self.action == "accept"


async def ask_to_confirm(ctx: Context, key: str, message: str) -> Answer:
    """A yes/no question (`key` names it among the request's input requests)."""
    if not _declared(ctx, "form"):
        return Answer("unsupported")
    if _asks_by_result(ctx):
        return answered(ctx, key) or _input_required(key, {"mode": "form", "message": message, **_CONFIRM})
    if not ctx.session.can_send_request:
        return Answer("unsupported")
    result = await ctx.session.elicit_form(message, CONFIRM_SCHEMA, ctx.request_id)
    return Answer(result.action)


async def ask_to_visit(ctx: Context, key: str, message: str, url: str) -> Answer:
    """Ask the human to open `url` and say when done (`key` names the question, across a retry too)."""
    if _asks_by_result(ctx):
        if not _declared(ctx, "url"):
            return Answer("unsupported")
        return answered(ctx, key) or _input_required(key, {"mode": "url", "message": message, "url": url})
    if _capabilities(ctx) is None and ctx.request is not None:  # stateless HTTP, no session: unknown
        raise _url_required(message, url, key)
    if not _declared(ctx, "url"):
        return Answer("unsupported")
    if not ctx.session.can_send_request:  # no stream to ask on: the client visits the URL and calls again
        raise _url_required(message, url, key)
    try:
        result = await ctx.session.elicit_url(message, url, key, ctx.request_id)
    except NoBackChannelError:  # the client is told to visit the URL and call again
        raise _url_required(message, url, key) from None
    return Answer(result.action)


def answered(ctx: Context, key: str) -> Answer | None:
    """On a 2026-07-28 retry: the answer given to the question `key` (anything but an action counts as
    cancel); None when the request carries none."""
    responses = (ctx.params or {}).get(INPUT_RESPONSES_KEY)
    response = responses.get(key) if isinstance(responses, Mapping) else None
    if response is None:
        return None
    action = response.get("action") if isinstance(response, Mapping) else None
    return Answer(action if action in _ANSWERS else "cancel")


_CONFIRM = {"requestedSchema": CONFIRM_SCHEMA}


def asks_by_result(ctx: Context) -> bool:
    """Whether this client is asked through results (2026-07-28), never by a request during its call."""
    return _asks_by_result(ctx)


def declared(ctx: Context, mode: Literal["form", "url"]) -> bool:
    return _declared(ctx, mode)


def capabilities_of(ctx: Context) -> types.ClientCapabilities | None:
    return _capabilities(ctx)


def _asks_by_result(ctx: Context) -> bool:
    return is_version_at_least(ctx.protocol_version, INPUT_REQUIRED_VERSION)


def _declared(ctx: Context, mode: Literal["form", "url"]) -> bool:
    """The client declared elicitation (form mode is what a bare `elicitation: {}` means), in `mode`."""
    capabilities = _capabilities(ctx)
    elicitation = getattr(capabilities, "elicitation", None)
    if elicitation is None:
        return False
    return mode == "form" or getattr(elicitation, "url", None) is not None


def _capabilities(ctx: Context) -> types.ClientCapabilities | None:
    """What the client declared: in this connection's handshake (stdio), in its HTTP session's (remembered
    in Redis: sessions.py), or in the request itself (2026-07-28)."""
    if ctx.session.client_capabilities is not None:
        return ctx.session.client_capabilities
    handshake = handshake_of(ctx.request.scope) if isinstance(ctx.request, Request) else None
    return None if handshake is None else handshake.capabilities


def _input_required(key: str, question: dict[str, Any]) -> Answer:
    # The state is echoed back by the client; the answer itself is in its inputResponses.
    return Answer("pending", input_required(key, "elicitation/create", question, key))


def input_required(key: str, method: str, params: Mapping[str, Any], state: str) -> dict[str, Any]:
    """A 2026-07-28 `input_required` result asking one request (`key` names it among the retry's answers)."""
    return {
        "resultType": "input_required",
        "inputRequests": {key: {"method": method, "params": dict(params)}},
        "requestState": state,
    }


def _url_required(message: str, url: str, key: str) -> UrlElicitationRequiredError:
    params = types.ElicitRequestURLParams(mode="url", message=message, url=url, elicitation_id=key)
    return UrlElicitationRequiredError([params], f"{message} {url}")
