"""What an MCP upstream asks during a call, at its seams: a 2026-07-28 caller's retry state (the gateway's
`Resume`, its answer handed back through fakeredis), a call's answers to a server's input requests
(`CallRelay.answer_inputs`), and a shared session's routing of a 2025-11-25 request that names its task."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import ElicitRequestFormParams, ElicitResult

from tests.support.mcp_servers import AnsweringCaller
from worker.gateway.mcp.relay import STATE_PREFIX, Follow, Resume
from worker.mcp_client.relay import RELATED_TASK_META_KEY, CallRelay, InFlight
from worker.protocol import Relay, call_answer_key, call_events_key

FORM = {"mode": "form", "message": "Which roast?", "requestedSchema": {"type": "object", "properties": {}}}


def state_of(fields: Mapping[str, Any]) -> str:
    return STATE_PREFIX + base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()


def test_a_requests_state_is_ours_or_not() -> None:
    """Our prefix with the call, the events' position and the request's id; another state is not ours (the
    approval's, a client's own); ours malformed is -32602."""
    resume = Resume.of({"requestState": state_of({"call": "c-1", "after": "17-0", "asked": "q-9"})})
    assert resume == Resume("c-1", "17-0", "q-9")
    assert Resume.of({"requestState": "toolworker/approval"}) is None
    assert Resume.of({}) is None and Resume.of(None) is None
    for broken in (STATE_PREFIX + "%%%", STATE_PREFIX + "bm90IGpzb24", state_of({"call": "c-1"})):
        with pytest.raises(MCPError) as refused:
            Resume.of({"requestState": broken})
        assert refused.value.error.code == -32602


async def test_the_retrys_answer_reaches_the_worker_and_a_missing_one_is_an_error() -> None:
    redis = fakeredis.FakeAsyncRedis()
    resume = Resume("c-1", "17-0", "q-9")
    await resume.answer(redis, {"inputResponses": {"q-9": {"action": "accept", "content": {"roast": "dark"}}}})
    await resume.answer(redis, {"inputResponses": {"another": {"action": "accept"}}})
    raw = await redis.lrange(call_answer_key("c-1", "q-9"), 0, -1)
    answers = [json.loads(item) for item in raw]
    assert answers[0] == {"result": {"action": "accept", "content": {"roast": "dark"}}}
    assert answers[1]["error"]["code"] == -32600, answers
    assert await redis.ttl(call_answer_key("c-1", "q-9")) > 0


async def test_a_calls_input_requests_are_asked_or_declined_and_noted() -> None:
    caller = AnsweringCaller({"roast": "dark"})
    listening = CallRelay(caller, Relay(elicitation=["form"]))
    answers = await listening.answer_inputs({"k": {"method": "elicitation/create", "params": FORM}})
    assert answers == {"k": {"action": "accept", "content": {"roast": "dark"}}} and caller.asked == ["Which roast?"]
    deaf = CallRelay()
    assert await deaf.answer_inputs({"k": {"method": "elicitation/create", "params": FORM}}) == {
        "k": {"action": "decline"}
    }
    assert "cannot be asked during a call" in deaf.notes[0]


@pytest.mark.parametrize(
    "request_",
    [
        {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}},  # not declared
        {"method": "roots/list"},
    ],
)
async def test_an_input_request_the_call_cannot_answer_ends_it(request_: dict[str, Any]) -> None:
    with pytest.raises(MCPError):
        await CallRelay().answer_inputs({"k": request_})


async def test_a_request_naming_a_task_goes_to_the_call_waiting_on_it() -> None:
    """Two calls in flight on the shared session (a request naming no task is declined, unnoted); one names
    the task a third call waits on: that call is asked."""
    in_flight = InFlight()
    waiting = AnsweringCaller({"roast": "light"})
    in_flight.calls += [CallRelay(AnsweringCaller({})), CallRelay(AnsweringCaller({}))]
    in_flight.tasks["t-1"] = CallRelay(waiting, Relay(elicitation=["form"]))
    params = ElicitRequestFormParams.model_validate(FORM)
    named = ClientRequestContext(session=None, request_id=1, meta={RELATED_TASK_META_KEY: {"taskId": "t-1"}})  # type: ignore[arg-type]
    assert await in_flight.on_elicit(named, params) == ElicitResult(action="accept", content={"roast": "light"})
    unnamed = ClientRequestContext(session=None, request_id=2)  # type: ignore[arg-type]
    assert await in_flight.on_elicit(unnamed, params) == ElicitResult(action="decline")
    assert waiting.asked == ["Which roast?"]


async def test_a_notification_being_relayed_when_the_result_comes_is_relayed_whole() -> None:
    """The caller's stream is slow to take the first log message; the result ends the wait meanwhile (the follower
    is cancelled): the drain finishes that message, then relays the next, each once and in order."""
    redis = fakeredis.FakeAsyncRedis()
    call_id = "call-relay-drain"
    for level in ("warning", "error"):
        event = {"kind": "log", "level": level, "logger": "chatty", "data": f"a {level} message"}
        await redis.xadd(call_events_key(call_id), {"event": json.dumps(event)})
    started, sent = asyncio.Event(), []

    async def send_notification(notification: Any, request_id: Any) -> None:
        started.set()
        await asyncio.sleep(0.05)  # a stream that takes its time
        sent.append(notification.params.level)

    session = SimpleNamespace(send_notification=send_notification)
    ctx: Any = SimpleNamespace(session=session, request_id=7, protocol_version="2025-11-25", params={})
    follow = Follow(ctx, redis, call_id, {"logLevel": "warning"})
    following = asyncio.ensure_future(follow.follow())
    await asyncio.wait_for(started.wait(), 5)
    following.cancel()  # what the result's arrival does to the follower
    with contextlib.suppress(asyncio.CancelledError):
        await following
    await follow.drain()
    assert sent == ["warning", "error"]
    await redis.aclose()
