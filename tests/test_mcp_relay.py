"""An MCP upstream speaking to the caller during a call: its progress and log messages reach an MCP caller
that asked for them, its elicitation and sampling requests are asked of a caller that can answer (the answer
going back unchanged), and declined otherwise. Real processes: the reference server (server-everything) and
an `mcp` SDK server as upstreams, a worker, a gateway, and the `mcp` SDK's `Client` as the caller."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import (
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    LoggingMessageNotificationParams,
    TextContent,
)

from tests.support.gateway_stack import Gateway, auth, gateway_env, start_gateway
from tests.support.mcp_servers import (
    EVERYTHING,
    McpServerProcess,
    McpStack,
    everything,
    mcp_stack,
    sdk_server,
    serving_worker,
)
from tests.support.waiting import wait_until
from worker.client import ToolClient
from worker.protocol import Relay, parse_call

pytestmark = [pytest.mark.timeout(240), pytest.mark.integration]
MODERN = "2026-07-28"


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[McpServerProcess, McpServerProcess]]:
    if not EVERYTHING.exists():
        pytest.fail("server-everything is not installed: run `make test` (the Makefile's MCP_EVERYTHING rule)")
    started = everything().start(), sdk_server().start()
    yield started
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def stack(
    upstreams: tuple[McpServerProcess, McpServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[McpStack]:
    ref, sdk = upstreams
    folder = tmp_path_factory.mktemp("relay-defs")
    (folder / "mcp.yaml").write_text(
        "upstreams:\n"
        f"  everything: {{mcp: {{url: '{ref.url}', include: ['echo', 'trigger-*']}}}}\n"
        f"  sdk: {{mcp: {{url: '{sdk.url}'}}}}\n"
    )
    stack = mcp_stack(folder, tmp_path_factory, ("everything", "sdk"))
    yield stack
    stack.redis.stop()


@pytest.fixture(scope="module")
def worker_client(stack: McpStack) -> Iterator[ToolClient]:
    with serving_worker(stack) as client:
        yield client


@pytest.fixture(scope="module")
def gateway(stack: McpStack, worker_client: ToolClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    env = gateway_env(stack.redis.url, stack.definitions)
    started = start_gateway(env, tmp_path_factory.mktemp("gateway") / "gateway.log")
    yield started
    started.stop()


async def called(gateway: Gateway, name: str, arguments: dict[str, Any], mode: str = "legacy", **kw: Any) -> Any:
    """A tool called through the gateway by the SDK's Client (`kw`: its callbacks, a log level to set first)."""
    level = kw.pop("set_level", None)
    progress = kw.pop("progress_callback", None)
    async with httpx2.AsyncClient(headers=auth(), timeout=60) as http:
        transport = streamable_http_client(gateway.url + "/mcp", http_client=http)
        async with Client(transport, mode=mode, **kw) as client:  # type: ignore[arg-type]  # a mode the test names
            if level is not None:
                with warnings.catch_warnings():  # deprecated at 2026-07-28; this is a 2025-11-25 session
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    await client.set_logging_level(level)
            return await client.call_tool(name, arguments, progress_callback=progress)


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_upstream_progress_reaches_the_caller_and_only_increases(gateway: Gateway, mode: str) -> None:
    """server-everything's long-running operation reports 4 steps: the caller hears them as its own call's
    progress, each value above the last (the gateway's own "waiting" progress may come first)."""
    heard: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, total, message))

    arguments = {"duration": 2, "steps": 4}
    name = "everything_trigger-long-running-operation"
    result = asyncio.run(called(gateway, name, arguments, mode, progress_callback=on_progress))
    assert not result.is_error and "Steps: 4" in text(result), result
    values = [value for value, _total, _message in heard]
    assert values == sorted(set(values)), heard
    upstream = [(value, total) for value, total, _message in heard if total is not None]
    assert len(upstream) == 4, heard
    offset = upstream[0][1] - 4  # the upstream's total of 4, shifted by what was reported before
    assert [(round(value - offset, 6), round(total - offset, 6)) for value, total in upstream] == [
        (i, 4) for i in (1, 2, 3, 4)
    ], heard


def test_upstream_progress_after_the_gateways_waiting_progress_continues_from_it(gateway: Gateway) -> None:
    """The upstream's first step comes after the gateway reported a second of waiting: its steps (and their
    messages) follow on from there, shifted, never going back."""
    heard: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, total, message))

    arguments = {"steps": 2, "seconds": 1.6}
    result = asyncio.run(called(gateway, "sdk_steps", arguments, progress_callback=on_progress))
    assert not result.is_error and text(result).startswith("2 steps"), result
    waiting = [value for value, total, _message in heard if total is None]
    steps = [(value, total, message) for value, total, message in heard if total is not None]
    assert waiting and heard[0][1] is None, heard  # the gateway's own came first
    offset = steps[0][1] - 2
    assert offset >= waiting[-1], heard
    assert [(round(value - offset, 6), message) for value, _total, message in steps] == [
        (1, "Step 1 of 2 done."),
        (2, "Step 2 of 2 done."),
    ], heard
    assert [value for value, _total, _message in heard] == sorted({value for value, _t, _m in heard}), heard


def test_concurrent_calls_each_hear_their_own_progress(gateway: Gateway) -> None:
    """Three calls followed at once (one reader of the gateway's Redis for all): each hears its own steps."""
    heard: dict[int, list[str | None]] = {2: [], 3: [], 4: []}

    async def one(steps: int) -> CallToolResult:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            if total is not None:
                heard[steps].append(message)

        arguments = {"steps": steps, "seconds": 0.3}
        return await called(gateway, "sdk_steps", arguments, progress_callback=on_progress)

    async def all_three() -> list[CallToolResult]:
        return list(await asyncio.gather(*(one(steps) for steps in heard)))

    results = asyncio.run(all_three())
    assert [text(result) for result in results] == ["2 steps", "3 steps", "4 steps"], results
    for steps, messages in heard.items():
        assert messages == [f"Step {i} of {steps} done." for i in range(1, steps + 1)], heard


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_upstream_log_messages_at_the_callers_level(gateway: Gateway, mode: str) -> None:
    """The SDK server logs at debug, info, warning and error during its call: a caller at `warning` (set with
    `logging/setLevel` in a session; on 2026-07-28 in each request) hears the last two, as its own."""
    heard: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        heard.append(params)

    kw: dict[str, Any] = {"logging_callback": on_log}
    kw.update({"set_level": "warning"} if mode == "legacy" else {"log_level": "warning"})
    result = asyncio.run(called(gateway, "sdk_chatty", {}, mode, **kw))
    assert not result.is_error and text(result).startswith("said"), result
    assert [(p.level, p.data, p.logger) for p in heard] == [
        ("warning", "a warning message", "chatty"),
        ("error", "a error message", "chatty"),
    ], heard


@pytest.fixture(scope="module")
def second_gateway(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Another gateway process on the same Redis."""
    started = start_gateway(gateway.env, tmp_path_factory.mktemp("gateway-2") / "gateway.log")
    yield started
    started.stop()


def modern_call(url: str, name: str, params: dict[str, Any], capabilities: dict[str, Any]) -> dict[str, Any]:
    """One 2026-07-28 `tools/call` as plain HTTP (no SDK: each round goes where the test sends it)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, **params, "_meta": meta}}
    headers = {
        **auth(),
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    answer = httpx2.post(url + "/mcp", json=body, headers=headers, timeout=60)
    assert answer.status_code == (400 if "error" in answer.json() else 200), answer.text  # -32602 is a 400
    return dict(answer.json())


def test_a_2026_caller_answers_the_upstream_on_a_retry_that_reaches_another_gateway(
    gateway: Gateway, second_gateway: Gateway
) -> None:
    """The upstream's sampling request ends the first request with `input_required` (its params as the upstream
    sent them); the retry, sent to the other gateway process, hands the answer to the worker and gets the
    call's result. A state that is not ours, or a retry with other arguments, is refused."""
    name, arguments = "everything_trigger-sampling-request", {"prompt": "Name a colour.", "maxTokens": 20}
    capabilities = {"sampling": {}}
    first = modern_call(gateway.url, name, {"arguments": arguments}, capabilities)["result"]
    assert first["resultType"] == "input_required", first
    [(key, request)] = first["inputRequests"].items()
    assert request["method"] == "sampling/createMessage", request
    assert request["params"]["maxTokens"] == 20 and "Name a colour." in json.dumps(request["params"]), request
    state = first["requestState"]
    another = {"call": "a-call-nobody-made", "after": "0-0", "asked": key}
    another_state = "toolworker/relay." + base64.urlsafe_b64encode(json.dumps(another).encode()).decode()
    for params in (
        {"arguments": {**arguments, "maxTokens": 21}, "requestState": state},
        {"arguments": arguments, "requestState": another_state},
        {"arguments": arguments, "requestState": "toolworker/relay.bm90IGpzb24"},
    ):
        refused = modern_call(second_gateway.url, name, params, capabilities)
        assert refused["error"]["code"] == -32602 and "requestState" in refused["error"]["message"], refused
    answer = {"role": "assistant", "content": {"type": "text", "text": "Vermilion."}, "model": "caller-model"}
    retry = {"arguments": arguments, "requestState": state, "inputResponses": {key: answer}}
    final = modern_call(second_gateway.url, name, retry, capabilities)["result"]
    assert final.get("resultType", "complete") == "complete" and not final["isError"], final
    said = "\n".join(block["text"] for block in final["content"] if block["type"] == "text")
    assert "Vermilion." in said and "caller-model" in said, said


def test_a_caller_without_a_level_hears_no_log_messages(gateway: Gateway) -> None:
    heard: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        heard.append(params)

    result = asyncio.run(called(gateway, "sdk_chatty", {}, logging_callback=on_log))
    assert not result.is_error and heard == [], heard


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_upstream_elicitation_is_asked_of_the_caller_unchanged(gateway: Gateway, mode: str) -> None:
    """server-everything's form elicitation reaches the caller with its schema as sent (defaults, enum shapes),
    and the caller's answer is what the tool reports: on the call's stream (2025-11-25), or as an
    `input_required` result whose retry carries the answer (2026-07-28)."""
    asked: list[ElicitRequestParams] = []

    async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept", content={"name": "Ada Lovelace", "check": True, "integer": 7})

    name = "everything_trigger-elicitation-request"
    result = asyncio.run(called(gateway, name, {}, mode, elicitation_callback=on_elicit))
    assert not result.is_error, result
    assert len(asked) == 1, asked
    assert "Name: Ada Lovelace" in text(result) and "Favorite Integer: 7" in text(result), text(result)
    schema = asked[0].model_dump(by_alias=True)["requestedSchema"]["properties"]
    assert schema["integer"]["default"] == 42 and schema["number"]["default"] == 3.14, schema
    assert schema["titledSingleSelectEnum"]["oneOf"][0] == {"const": "hero-1", "title": "Superman"}, schema
    assert schema["legacyTitledEnum"]["enumNames"][0] == "Cats", schema


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_declined_elicitation_reaches_the_upstream(gateway: Gateway, mode: str) -> None:
    async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="decline")

    name = "everything_trigger-elicitation-request"
    result = asyncio.run(called(gateway, name, {}, mode, elicitation_callback=on_elicit))
    assert "User declined" in text(result), text(result)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_upstream_sampling_is_answered_by_the_caller(gateway: Gateway, mode: str) -> None:
    asked: list[CreateMessageRequestParams] = []

    async def on_sample(context: ClientRequestContext, params: CreateMessageRequestParams) -> CreateMessageResult:
        asked.append(params)
        answer = TextContent(type="text", text="forty-two, from the caller's model")
        return CreateMessageResult(role="assistant", content=answer, model="caller-model", stop_reason="endTurn")

    arguments = {"prompt": "What is six times seven?", "maxTokens": 50}
    name = "everything_trigger-sampling-request"
    result = asyncio.run(called(gateway, name, arguments, mode, sampling_callback=on_sample))
    assert not result.is_error and "forty-two, from the caller's model" in text(result), text(result)
    assert "caller-model" in text(result), text(result)
    assert asked and asked[0].max_tokens == 50 and "six times seven" in str(asked[0].messages[0].content), asked


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_caller_that_cannot_be_asked_gets_a_declined_request_and_a_note(gateway: Gateway, mode: str) -> None:
    """No elicitation declared, in either generation: the upstream's request is declined, and the tool
    result's note says so."""
    result = asyncio.run(called(gateway, "everything_trigger-elicitation-request", {}, mode))
    assert "User declined" in text(result), text(result)
    assert "cannot be asked during a call, so the request was declined" in text(result), text(result)


def test_a_url_elicitation_is_67_with_the_url_for_the_python_client(worker_client: ToolClient) -> None:
    url = "https://example.com/consent?flow=1"
    arguments = {"url": url, "message": "Approve access at the vendor."}
    result = worker_client.call("everything_trigger-url-elicitation", arguments, timeout=30)
    assert result.exit_code == 67, result.to_dict()
    assert url in (result.error or {})["message"], result.to_dict()
    declined = worker_client.call("everything_trigger-elicitation-request", {}, timeout=30)
    assert declined.exit_code == 0 and "declined" in (declined.note or ""), declined.to_dict()


def test_an_upstreams_url_required_error_is_67_with_its_url(worker_client: ToolClient) -> None:
    """server-everything's error path: -32042 (URL elicitation required) names its prerequisite page."""
    arguments = {"url": "https://example.com/x", "message": "m", "errorPath": True, "elicitationId": "e1"}
    result = worker_client.call("everything_trigger-url-elicitation", arguments, timeout=30)
    assert result.exit_code == 67 and "https://modelcontextprotocol.io" in (result.error or {})["message"], (
        result.to_dict()
    )


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_url_elicitation_is_asked_of_an_mcp_caller_in_url_mode(gateway: Gateway, mode: str) -> None:
    asked: list[Any] = []

    async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept")

    arguments = {"url": "https://example.com/consent", "message": "Approve access."}
    result = asyncio.run(
        called(gateway, "everything_trigger-url-elicitation", arguments, mode, elicitation_callback=on_elicit)
    )
    assert "User completed the URL elicitation flow" in text(result), text(result)
    assert asked[0].mode == "url" and asked[0].url == "https://example.com/consent", asked


def test_a_tasks_status_message_is_its_upstreams_last_progress(gateway: Gateway) -> None:
    """A 2026-07-28 task nobody streams: tasks/get says how far the upstream got, in the upstream's words."""
    headers = {**auth(), "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MODERN}

    def request(method: str, params: dict[str, Any], **extra: str) -> dict[str, Any]:
        capabilities = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
        sent = {**headers, "Mcp-Method": method, **extra}
        answer = httpx2.post(gateway.url + "/mcp", json=body, headers=sent, timeout=30)
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["result"])

    name = "sdk_steps"
    created = request("tools/call", {"name": name, "arguments": {"steps": 3, "seconds": 1}}, **{"Mcp-Name": name})
    task_id = created["taskId"]
    messages: list[str] = []

    def reported() -> bool:
        task = request("tasks/get", {"taskId": task_id}, **{"Mcp-Name": task_id})
        messages.append(task.get("statusMessage", ""))
        return task["status"] == "completed"

    wait_until(reported, 60, "the task's end")
    assert any(message.startswith("Step ") and message.endswith(" of 3 done.") for message in messages), messages


async def test_over_stdio_a_caller_hears_logs_and_answers_the_upstream(
    stack: McpStack, worker_client: ToolClient
) -> None:
    """`python -m worker mcp` on stdio (one client, its level kept by the process): log messages at the level
    set, and the upstream's elicitation asked of the client on the connection."""
    heard: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        heard.append(params)

    async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"name": "Grace Hopper"})

    env = gateway_env(stack.redis.url, stack.definitions)
    params = StdioServerParameters(command=sys.executable, args=["-m", "worker", "mcp"], env=env)
    async with Client(params, mode="legacy", logging_callback=on_log, elicitation_callback=on_elicit) as client:
        with warnings.catch_warnings():  # deprecated at 2026-07-28; this is a 2025-11-25 connection
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.set_logging_level("error")
        said = await client.call_tool("sdk_chatty", {})
        asked = await client.call_tool("everything_trigger-elicitation-request", {})
    assert text(said).startswith("said") and [(p.level, p.data) for p in heard] == [("error", "a error message")]
    assert "Name: Grace Hopper" in text(asked), text(asked)


@pytest.mark.parametrize(
    ("relay", "expected"),
    [
        (
            {"progress": True, "logLevel": "warning", "elicitation": ["form"]},
            Relay(progress=True, log_level="warning", elicitation=["form"]),
        ),
        ({"logLevel": "loud"}, None),  # what the caller listens for never fails the call
        ("yes", None),
    ],
)
def test_a_call_messages_relay_is_read_or_dropped(relay: object, expected: Relay | None) -> None:
    assert parse_call({"tool": "t", "relay": relay}, "id-1").relay == expected
