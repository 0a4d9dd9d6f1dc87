"""Asking the human behind an MCP client, through the protocol, in both of its generations (form mode).

    2026-07-28   the request is answered with an `input_required` result carrying the question (an
                 `elicitation/create` form); the client asks its human and sends the request again with
                 `inputResponses`, answered from them. Nothing is kept between the two rounds, so the
                 second may reach another gateway process.
    earlier      an `elicitation/create` request on the open request, where the client declared the
                 elicitation capability.

A client that can do neither cannot be asked (`CannotAsk`): the caller says what the human can do instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp_types.version import is_version_at_least

Context = ServerRequestContext[Any, Any]
INPUT_REQUIRED_VERSION = "2026-07-28"
# A question whose answer is the action alone (accept, decline or cancel): an empty form.
CONFIRM_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class Answer(StrEnum):
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"


@dataclass(frozen=True)
class InputRequired:
    """The result that asks (2026-07-28): the request's answer for this round."""

    result: dict[str, Any]


class CannotAsk(Exception):
    """The client can receive no question (it declared no elicitation, or its request has no back-channel)."""


async def ask_to_confirm(ctx: Context, key: str, message: str) -> Answer | InputRequired:
    """The human's answer to a yes/no question (`key` names it among the request's input requests), or,
    in a 2026-07-28 request's first round, the result that asks it."""
    if not _elicits(ctx):
        raise CannotAsk(message)
    if is_version_at_least(ctx.protocol_version, INPUT_REQUIRED_VERSION):
        response = _input_responses(ctx).get(key)
        if response is None:
            return InputRequired(_asking(key, message))
        return _answer(response)
    if not ctx.session.can_send_request:
        raise CannotAsk(message)
    result = await ctx.session.elicit_form(message, CONFIRM_SCHEMA, ctx.request_id)
    return Answer(result.action)


def _elicits(ctx: Context) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


def _asking(key: str, message: str) -> dict[str, Any]:
    question = {"mode": "form", "message": message, "requestedSchema": CONFIRM_SCHEMA}
    return {
        "resultType": "input_required",
        "inputRequests": {key: {"method": "elicitation/create", "params": question}},
        # Echoed back by the client; the answer itself is in its inputResponses.
        "requestState": key,
    }


def _input_responses(ctx: Context) -> Mapping[str, Any]:
    responses = (ctx.params or {}).get("inputResponses")
    return responses if isinstance(responses, Mapping) else {}


def _answer(response: Any) -> Answer:
    """An elicitation result's action; anything else counts as no answer (cancel)."""
    action = response.get("action") if isinstance(response, Mapping) else None
    return Answer(action) if action in {a.value for a in Answer} else Answer.CANCEL
