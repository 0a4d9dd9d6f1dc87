"""The gateway's pure pieces, without processes: paging, cursors, results, headers, withdrawal, the Guard, claims."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import fakeredis
import pytest
from mcp.shared.exceptions import MCPError

from worker.constants import TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.definitions.model import Auth, RequestTemplate, Tool, ToolSet, Upstream
from worker.definitions.templates import Template
from worker.envelope import ToolResult
from worker.gateway.catalog import Snapshot, with_tags
from worker.gateway.claims import Claim, Claims
from worker.gateway.headers import forwarded
from worker.gateway.identity.principals import static_tokens
from worker.gateway.identity.security import Gatekeeper, Guard
from worker.gateway.mcp import discovery
from worker.gateway.mcp.results import result_text, tool_result
from worker.gateway.mcp.server import _decode_cursor, _encode_cursor
from worker.protocol import task_message, without_call
from worker.settings import Settings

pytestmark = pytest.mark.timeout(30)


def toolset(count: int = 7) -> ToolSet:
    upstream = Upstream("api", Template.literal("http://api.test"), overridable_headers=frozenset({"x-user-token"}))
    tools = {
        f"tool_{i}": Tool(
            f"tool_{i}", "api", RequestTemplate(method="GET"), f"Tool {i}.", ("odd" if i % 2 else "even",)
        )
        for i in range(count)
    }
    return ToolSet({"api": upstream}, tools)


def test_pages_follow_names_and_survive_changes() -> None:
    """Pages go by name after the last one given, so a tool added meanwhile skips or repeats none."""
    snapshot = Snapshot(1, toolset())
    first, last = snapshot.after(None, 3)
    assert first == ["tool_0", "tool_1", "tool_2"] and last == "tool_2"
    grown = toolset()
    grown.tools["tool_10"] = Tool("tool_10", "api", RequestTemplate())
    second, _ = Snapshot(2, grown).after(last, 3)
    assert second == ["tool_3", "tool_4", "tool_5"]
    final, end = snapshot.after("tool_5", 3)
    assert final == ["tool_6"] and end is None


def test_tags_select_a_subset() -> None:
    """--tag keeps the tools with one of the tags, and every upstream."""
    subset = with_tags(toolset(), ["even"])
    assert sorted(subset.tools) == ["tool_0", "tool_2", "tool_4", "tool_6"] and "api" in subset.upstreams
    assert with_tags(toolset(), []).tools.keys() == toolset().tools.keys()


def test_cursors_are_opaque_and_checked() -> None:
    """A cursor round-trips; anything else is JSON-RPC error -32602."""
    cursor = _encode_cursor("tool_2")
    assert "tool" not in cursor and _decode_cursor(cursor) == "tool_2"
    for bad in ("", "###", "YWJj"):
        with pytest.raises(MCPError) as caught:
            _decode_cursor(bad)
        assert caught.value.error.code == -32602


def test_result_text_and_meta() -> None:
    """Success is the result as it is; failure is the error message, then the body under a label (none when
    the body is empty); a missing answer says so."""
    ok = ToolResult("c1", "t", status_code=200, result='{"a": 1}', attempts=1)
    failed = ToolResult("c2", "t", status_code=404, result="nope", exit_code=22, error={"type": "x", "message": "M."})
    empty = ToolResult("c4", "t", status_code=404, result="", exit_code=22, error={"type": "x", "message": "M."})
    assert result_text(ok) == '{"a": 1}' and result_text(failed) == "M.\n\nThe response body:\nnope"
    assert result_text(empty) == "M."
    answer = tool_result(failed, "c2", 5)
    assert answer["isError"] is True and answer["_meta"]["toolworker/call"]["statusCode"] == 404
    pending = tool_result(None, "c3", 5)
    assert pending["isError"] is True and "/v1/calls/c3" in pending["content"][0]["text"]


def test_only_overridable_headers_travel() -> None:
    """Headers the upstream lists go with the call; Authorization (even when listed) and others never."""
    upstream = Upstream("api", Template.literal(""), overridable_headers=frozenset({"x-user-token", "authorization"}))
    headers = {"x-user-token": "u", "authorization": "Bearer gateway", "cookie": "c", "x-other": "o"}
    assert forwarded(headers, upstream) == {"x-user-token": "u"}


def _calls_of(raw: str) -> Any:
    return json.loads(json.loads(raw)["body"])[0][0]


def test_withdrawal_edits_only_its_call() -> None:
    """A lone call's message goes; a batch loses that call only; a message without it is left."""
    lone = task_message("a", [{"callId": "a", "tool": "t"}], "q", TASK_EXECUTE).encode()
    batch = task_message("b", [[{"callId": "a", "tool": "t"}, {"callId": "b", "tool": "t"}]], "q", TASK_EXECUTE_BATCH)
    assert without_call(lone, "a") == (True, None)
    found, rest = without_call(batch.encode(), "a")
    assert found and rest is not None and [c["callId"] for c in _calls_of(rest)] == ["b"]
    assert '"a"' not in json.loads(rest)["headers"]["argsrepr"]
    assert without_call(lone, "zz") == (False, None)
    assert without_call(b"not json", "a") == (False, None)


def test_discovery_meta_tools_check_their_arguments() -> None:
    """Meta-tool answers come from the snapshot; wrong arguments name the field."""
    snapshot = Snapshot(0, toolset(60))
    listed = json.loads(discovery.answer("list_tools", {}, snapshot))
    assert listed["total"] == 60 and len(listed["tools"]) == discovery.LIST_PAGE_SIZE and listed["tags"]["odd"] == 30
    rest = json.loads(discovery.answer("list_tools", {"cursor": listed["nextCursor"]}, snapshot))
    assert len(rest["tools"]) == 10 and "nextCursor" not in rest
    schemas = json.loads(discovery.answer("get_tool_schema", {"names": ["tool_1", "x"]}, snapshot))
    assert schemas["missing"] == ["x"] and schemas["tools"][0]["annotations"]["readOnlyHint"] is True
    with pytest.raises(discovery.InvalidMetaArguments, match="`top_k`"):
        discovery.answer("search_tools", {"question": "q", "top_k": 0}, snapshot)


async def _asgi(app: Guard, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)  # type: ignore[arg-type]
    body_sent = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body_sent) if body_sent else {}


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def test_guard_checks_tokens_origin_and_size() -> None:
    """Bearer tokens (any of them), /healthz open, Origin on /mcp, and the body cap, all as JSON errors."""
    guard = Guard(_ok, Gatekeeper(static_tokens(Settings(gateway_tokens="t1,t2"), None)), [], max_body_bytes=10)
    assert (await _asgi(guard, "/v1/calls", {}))[0] == 401
    assert (await _asgi(guard, "/v1/calls", {"Authorization": "Bearer nope"}))[0] == 401
    assert (await _asgi(guard, "/v1/calls", {"Authorization": "Basic t1"}))[0] == 401
    assert (await _asgi(guard, "/v1/calls", {"Authorization": "Bearer t2"}))[0] == 200
    assert (await _asgi(guard, "/healthz", {}))[0] == 200
    evil = {"Authorization": "Bearer t1", "Origin": "https://evil.example"}
    status, body = await _asgi(guard, "/mcp", evil)
    assert status == 403 and body["error"]["type"] == "forbidden_origin"
    local = {"Authorization": "Bearer t1", "Origin": "http://127.0.0.1:5173"}
    assert (await _asgi(guard, "/mcp", local))[0] == 200
    status, body = await _asgi(guard, "/v1/calls", {"Authorization": "Bearer t1"}, b"x" * 11)
    assert status == 413 and body["error"]["type"] == "too_large"


async def test_claims_share_a_round_trip_and_find_the_first() -> None:
    """Claims made together are answered together; a claimed callId answers with its first claim."""
    client = fakeredis.FakeAsyncRedis()
    claims = Claims(client, ttl_s=60)
    first, second = Claim("f1", "tool_a"), Claim("f2", "tool_b")
    results = await asyncio.gather(claims.claim("id-1", first), claims.claim("id-2", second))
    assert results == [None, None]
    assert await claims.claim("id-1", Claim("other", "tool_a")) == first
    assert (await claims.get("id-2")) == second
    await claims.release("id-2")
    assert await claims.get("id-2") is None
    await client.aclose()


def test_without_tokens_the_gateway_binds_loopback_only() -> None:
    """Asked for 0.0.0.0 without tokens, the gateway binds 127.0.0.1 (and says so); with tokens, as asked."""
    from structlog.testing import capture_logs

    from worker.gateway.app import bind_host
    from worker.settings import Settings

    with capture_logs() as logs:
        assert bind_host(Settings(), "0.0.0.0") == "127.0.0.1"
    assert logs[0]["event"] == "gateway.loopback_only" and "TOKENS" in logs[0]["reason"]
    assert bind_host(Settings(), "127.0.0.1") == "127.0.0.1"
    assert bind_host(Settings(gateway_tokens="t"), "0.0.0.0") == "0.0.0.0"


def test_the_per_call_credential_header_travels() -> None:
    """The call header that carries an end user's own credential (`auth.per_call_header`) goes with the call."""
    auth = Auth("bearer", per_call_header="x-user-token")
    upstream = Upstream("api", Template.literal(""), auth=auth)
    headers = {"x-user-token": "u", "authorization": "Bearer gateway"}
    assert forwarded(headers, upstream) == {"x-user-token": "u"}
