"""Approval before risky calls, through real processes: a Redis-compatible server, workers, a gateway with
principals, a local upstream counting requests, the MCP SDK's own client in both protocol generations,
and the `toolworker approvals` command line."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitRequestParams, ElicitResult

from tests.conftest import FIXTURES, start_worker, stop_worker, worker_env
from tests.support.gateway_stack import TOKEN, Gateway, auth, gateway_env, start_gateway, text_of, wait_listening
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver, ReceiverServer
from worker.client import ToolClient
from worker.constants import AUDIT_STREAM_KEY, DEFAULT_QUEUE
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.gateway.mcp.results import CALL_META_KEY
from worker.protocol import task_message
from worker.queue.scheduler import IN_FLIGHT_KEY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
DEFINITIONS = FIXTURES / "approvals"
OPS_TOKEN = "ops-token-approves-0123"
BOT_TOKEN = "bot-token-calls-only-42"
USER_SECRET = "user-secret-value-8d1f"
ACCESS = """
tokens:
  ops: {token: "${env:TEST_OPS_TOKEN}", tools: ["*"], grants: [approve]}
  bot: {token: "${env:TEST_BOT_TOKEN}", tools: ["*"]}
"""
BRIEF_TTL_S = 2
HOOK_SECRET = "whsec_" + base64.b64encode(b"approvals' webhook key, 32 bytes").decode()


@dataclass
class ApprovalStack:
    redis: EmbeddedRedis
    upstream: UpstreamState
    gateway: Gateway
    worker_env: dict[str, str]
    directory: Path
    worker: subprocess.Popen[bytes]
    brief_worker: subprocess.Popen[bytes]
    receiver: Receiver

    @property
    def url(self) -> str:
        return self.gateway.url

    def hits(self, path: str) -> int:
        return self.upstream.hits_to(path)


@pytest.fixture(scope="module")
def stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApprovalStack]:
    """A Redis of its own, a worker on tests/fixtures/approvals, the counting upstream, a gateway with an
    approver (ops), a caller without the grant (bot) and the legacy token (every grant)."""
    directory = tmp_path_factory.mktemp("approvals")
    server = EmbeddedRedis(directory / "redis").start()
    state = UpstreamState()
    upstream = ServerThread(make_upstream(state)).start()
    receiver = Receiver([HOOK_SECRET], free_port())
    hooks = ReceiverServer(receiver).start()
    env = worker_env(server.url, upstream.url, dns_server.address, DEFINITIONS)
    env.update(TOOLWORKER_CALLBACK_ALLOW="127.0.0.1", TOOLWORKER_CALLBACK_SECRET=HOOK_SECRET)
    worker = start_worker(env, directory / "worker.log")
    brief_env = {**env, "TOOLWORKER_APPROVAL_TTL_SECONDS": str(BRIEF_TTL_S)}
    brief_worker = start_worker(brief_env, directory / "brief-worker.log", "-Q", "approvals-brief")
    access = directory / "access.yaml"
    access.write_text(ACCESS)
    extra = {"TOOLWORKER_GATEWAY_ACCESS": str(access), "TEST_OPS_TOKEN": OPS_TOKEN, "TEST_BOT_TOKEN": BOT_TOKEN}
    extra["TOOLWORKER_CALLBACK_ALLOW"] = "127.0.0.1"
    gateway = None
    try:
        gateway = start_gateway(gateway_env(server.url, DEFINITIONS, **extra), directory / "gateway.log")
        wait_listening(gateway, ready=True)
        handle = ApprovalStack(server, state, gateway, env, directory, worker, brief_worker, receiver)
        yield handle
        gateway = handle.gateway
        worker = handle.worker
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        stop_worker(brief_worker)
        hooks.stop()
        upstream.stop()
        server.stop()


def item() -> str:
    return uuid.uuid4().hex[:12]


def rest_call(stack: ApprovalStack, tool: str, name: str, token: str = TOKEN, **extra: Any) -> httpx2.Response:
    body = {"tool": tool, "arguments": {"item": name}, **extra}
    return httpx2.post(stack.url + "/v1/calls", json=body, headers=auth(token), timeout=60)


def listed(stack: ApprovalStack, token: str = OPS_TOKEN) -> dict[str, dict[str, Any]]:
    answer = httpx2.get(stack.url + "/v1/approvals", headers=auth(token), timeout=30)
    assert answer.status_code == 200, answer.text
    return {row["callId"]: row for row in answer.json()["approvals"]}


def wait_parked(stack: ApprovalStack, call_id: str) -> dict[str, Any]:
    wait_until(lambda: call_id in listed(stack), 30, f"call {call_id} parked")
    return listed(stack)[call_id]


def decide(
    stack: ApprovalStack, call_id: str, decision: str, token: str = OPS_TOKEN, reason: str = ""
) -> httpx2.Response:
    body = {"decision": decision, "reason": reason}
    return httpx2.post(f"{stack.url}/v1/approvals/{call_id}", json=body, headers=auth(token), timeout=30)


def envelope(stack: ApprovalStack, call_id: str) -> dict[str, Any]:
    answer = httpx2.get(f"{stack.url}/v1/calls/{call_id}?waitSeconds=30", headers=auth(), timeout=60)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def cli(stack: ApprovalStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env["TOOLWORKER_REDIS_URL"] = stack.redis.url
    argv = [sys.executable, "-m", "worker", "approvals", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def audit_records(stack: ApprovalStack) -> list[dict[str, str]]:
    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    try:
        return [fields for _, fields in client.xrange(AUDIT_STREAM_KEY)]
    finally:
        client.close()


# --- REST ------------------------------------------------------------------------------------------------


def test_call_without_approval_runs_at_once(stack: ApprovalStack) -> None:
    """A GET of the guarded upstream, and a POST whose tool opts out, run without anyone asked."""
    name = item()
    read = rest_call(stack, "read_item", name)
    note = rest_call(stack, "note_item", name)
    assert read.status_code == 200 and read.json()["exitCode"] == 0
    assert note.status_code == 200 and note.json()["exitCode"] == 0
    assert stack.hits(f"/echo/read/{name}") == 1 and stack.hits(f"/echo/note/{name}") == 1


def test_rest_call_is_parked_until_approved_then_runs_once(stack: ApprovalStack) -> None:
    """A REST call that needs approval answers 202 at once, is listed, is not sent; approved, it runs once;
    a second approval (a double click) is refused 409; the audit trail names the approver."""
    name = item()
    answer = rest_call(stack, "delete_item", name, headers={"X-User-Token": USER_SECRET})
    assert answer.status_code == 202 and answer.json()["status"] == "awaiting_approval"
    call_id = answer.json()["callId"]
    row = wait_parked(stack, call_id)
    assert row["tool"] == "delete_item" and row["method"] == "DELETE" and row["principal"] == "token-1"
    assert row["target"] == f"DELETE guarded /echo/delete/{name}" and row["arguments"] == {"item": name}
    assert row["headers"] == {"x-user-token": "[redacted]"} and USER_SECRET not in json.dumps(row)
    assert row["since"] < row["expires"]
    assert httpx2.get(f"{stack.url}/v1/calls/{call_id}", headers=auth(), timeout=30).status_code == 202
    assert stack.hits(f"/echo/delete/{name}") == 0
    approved = decide(stack, call_id, "approve", reason="checked")
    assert approved.status_code == 200 and approved.json()["decidedBy"] == "ops"
    again = decide(stack, call_id, "approve")
    assert again.status_code == 409 and again.json()["error"]["state"] in ("approved", "started")
    assert envelope(stack, call_id)["exitCode"] == 0
    assert stack.hits(f"/echo/delete/{name}") == 1
    assert call_id not in listed(stack)
    decisions = [r for r in audit_records(stack) if r.get("callId") == call_id and r.get("decision")]
    assert [(r["principal"], r["decision"], r["reason"]) for r in decisions] == [("ops", "approve", "checked")]
    assert all(USER_SECRET not in json.dumps(r) for r in audit_records(stack))
    assert USER_SECRET not in stack.gateway.log_text()
    assert USER_SECRET not in (stack.directory / "worker.log").read_text(errors="replace")


def test_batch_and_toolserver_calls_are_parked_too(stack: ApprovalStack) -> None:
    """In a batch, the call that needs approval is `awaiting_approval` while the other is answered; a
    ToolServer call answers at once that it waits; neither parked call is sent."""
    name = item()
    calls = [{"tool": "read_item", "arguments": {"item": name}}, {"tool": "delete_item", "arguments": {"item": name}}]
    batch = httpx2.post(stack.url + "/v1/batches", json={"calls": calls}, headers=auth(), timeout=60).json()
    assert batch["results"][0]["exitCode"] == 0 and batch["results"][1]["status"] == "awaiting_approval"
    body = {"tool_name": "peek_item", "arguments": {"item": name}}
    toolserver = httpx2.post(f"{stack.url}/toolserver/execute_tool", json=body, headers=auth(), timeout=60)
    assert toolserver.status_code == 450 and "approval" in toolserver.json()["detail"]
    wait_parked(stack, batch["results"][1]["callId"])

    def mine() -> list[str]:
        return sorted(r["tool"] for r in listed(stack).values() if r["arguments"] == {"item": name})

    wait_until(lambda: mine() == ["delete_item", "peek_item"], 30, "both calls parked")
    assert stack.hits(f"/echo/delete/{name}") == 0 and stack.hits(f"/echo/peek/{name}") == 0


def test_denied_call_is_answered_77_with_the_reason(stack: ApprovalStack) -> None:
    """Denied, a parked call is never sent; its envelope has exit code 77 and the reason."""
    name = item()
    call_id = rest_call(stack, "delete_item", name).json()["callId"]
    wait_parked(stack, call_id)
    assert decide(stack, call_id, "deny", reason="not on a Friday").status_code == 200
    result = envelope(stack, call_id)
    assert result["exitCode"] == 77 and result["error"]["type"] == "approval_denied"
    assert "not on a Friday" in result["error"]["message"] and "ops" in result["error"]["message"]
    assert stack.hits(f"/echo/delete/{name}") == 0


def test_a_parked_calls_callback_hears_of_the_decision(stack: ApprovalStack) -> None:
    """A parked call with a callback: denied, its 77 envelope is delivered there (signed); approved, the
    envelope of the call that ran is."""
    url = stack.receiver.url("decided")
    denied = rest_call(stack, "delete_item", item(), callback={"url": url}).json()["callId"]
    approved_name = item()
    approved = rest_call(stack, "delete_item", approved_name, callback={"url": url}).json()["callId"]
    wait_parked(stack, denied)
    wait_parked(stack, approved)
    assert decide(stack, denied, "deny", reason="not today").status_code == 200
    assert decide(stack, approved, "approve").status_code == 200
    wait_until(lambda: len(stack.receiver.accepted("decided")) == 2, 30, "both deliveries")
    delivered = {json.loads(d.body)["callId"]: json.loads(d.body) for d in stack.receiver.accepted("decided")}
    assert delivered[denied]["exitCode"] == 77 and "not today" in delivered[denied]["error"]["message"]
    assert delivered[approved]["exitCode"] == 0
    assert all(d.verified == [True] for d in stack.receiver.accepted("decided"))
    assert stack.hits(f"/echo/delete/{approved_name}") == 1


def test_a_principal_without_approve_cannot_list_or_decide(stack: ApprovalStack) -> None:
    """403 for a caller whose grants lack `approve`; the call stays parked."""
    call_id = rest_call(stack, "delete_item", item(), token=BOT_TOKEN).json()["callId"]
    row = wait_parked(stack, call_id)
    assert row["principal"] == "bot"
    assert httpx2.get(stack.url + "/v1/approvals", headers=auth(BOT_TOKEN), timeout=30).status_code == 403
    refused = decide(stack, call_id, "approve", token=BOT_TOKEN)
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
    assert call_id in listed(stack)
    assert decide(stack, "no-such-call", "approve").status_code == 404
    assert decide(stack, call_id, "deny").status_code == 200


def test_bad_decision_bodies_are_422(stack: ApprovalStack) -> None:
    """A decision that is neither approve nor deny, or an extra field, is refused with a JSON 422."""
    for body in ({"decision": "maybe"}, {"decision": "approve", "extra": 1}, {}):
        answer = httpx2.post(f"{stack.url}/v1/approvals/x", json=body, headers=auth(OPS_TOKEN), timeout=30)
        assert answer.status_code == 422 and answer.json()["error"]["type"] == "invalid_request"


def test_unanswered_call_expires_with_75(stack: ApprovalStack) -> None:
    """Nobody decides within TOOLWORKER_APPROVAL_TTL_SECONDS: the call is answered 75, never sent, no longer
    listed, and can no longer be approved."""
    name = item()
    call_id = rest_call(stack, "brief_item", name).json()["callId"]
    result = envelope(stack, call_id)
    assert result["exitCode"] == 75 and result["error"]["type"] == "approval_expired"
    assert call_id not in listed(stack)
    late = decide(stack, call_id, "approve")
    assert late.status_code == 409 and late.json()["error"]["state"] == "expired"
    assert stack.hits(f"/echo/brief/{name}") == 0


def test_deciders_at_once_run_the_call_once(stack: ApprovalStack) -> None:
    """Eight approvals sent at once (double clicks, several operators): one is taken, the others are 409;
    the call runs once."""
    name = item()
    call_id = rest_call(stack, "delete_item", name).json()["callId"]
    wait_parked(stack, call_id)
    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(lambda _: decide(stack, call_id, "approve").status_code, range(8)))
    assert codes == [200] + [409] * 7
    assert envelope(stack, call_id)["exitCode"] == 0
    assert stack.hits(f"/echo/delete/{name}") == 1


def test_an_approved_call_delivered_again_is_not_sent_again(stack: ApprovalStack) -> None:
    """The message of a call that an approval already ran, pushed again (as a lost worker's comes back),
    is not sent to the upstream a second time."""
    name = item()
    call_id = rest_call(stack, "delete_item", name).json()["callId"]
    wait_parked(stack, call_id)
    assert decide(stack, call_id, "approve").status_code == 200
    assert envelope(stack, call_id)["exitCode"] == 0
    client = redis.Redis.from_url(stack.redis.url)
    try:
        client.lpush(
            DEFAULT_QUEUE,
            task_message(
                call_id, [{"callId": call_id, "tool": "delete_item", "arguments": {"item": name}}], DEFAULT_QUEUE
            ),
        )
        wait_until(
            lambda: client.llen(DEFAULT_QUEUE) == 0 and int(client.hget(IN_FLIGHT_KEY, "default") or 0) == 0,
            30,
            "the message taken and settled",
        )
    finally:
        client.close()
    assert stack.hits(f"/echo/delete/{name}") == 1


def test_parked_and_decided_calls_leave_no_count_behind(stack: ApprovalStack) -> None:
    """Once its parked calls are decided and answered, a tenant has nothing waiting, queued or in flight: the
    counts `toolworker queue` prints (and max_queued limits) are not held by parked calls."""
    approved = rest_call(stack, "delete_item", item()).json()["callId"]
    denied = rest_call(stack, "delete_item", item()).json()["callId"]
    wait_parked(stack, approved)
    wait_parked(stack, denied)
    assert decide(stack, approved, "approve").status_code == 200
    assert decide(stack, denied, "deny", reason="no").status_code == 200
    assert envelope(stack, approved)["exitCode"] == 0 and envelope(stack, denied)["exitCode"] == 77

    def default_rows() -> list[dict[str, Any]]:
        argv = [sys.executable, "-m", "worker", "queue", "--format", "json"]
        done = subprocess.run(argv, env=stack.worker_env, capture_output=True, text=True, timeout=60, check=True)
        return [row for row in json.loads(done.stdout) if row["tenant"] == "default"]

    wait_until(
        lambda: all(row["waiting"] == row["queued"] == row["in_flight"] == 0 for row in default_rows()),
        30,
        f"no count left behind: {default_rows()}",
    )


# --- queue producers and the command line ------------------------------------------------------------


def test_queued_call_is_parked_and_approved_from_the_cli(stack: ApprovalStack) -> None:
    """A call enqueued by the Python client is parked, not sent; `approvals list` prints its callId and
    `approvals approve` runs it once."""
    name = item()
    with ToolClient(stack.redis.url) as client:
        handle = client.submit("delete_item", {"item": name})
        wait_parked(stack, handle.call_id)
        assert stack.hits(f"/echo/delete/{name}") == 0
        listing = cli(stack, "list")
        assert listing.returncode == 0 and handle.call_id in listing.stdout
        approved = cli(stack, "approve", handle.call_id)
        assert approved.returncode == 0, approved.stderr
        assert handle.get(timeout=30).exit_code == 0
    assert stack.hits(f"/echo/delete/{name}") == 1
    decided = [r for r in audit_records(stack) if r.get("callId") == handle.call_id and r.get("decision")]
    assert len(decided) == 1 and decided[0]["principal"].startswith("cli:")


def test_cli_deny_with_a_reason(stack: ApprovalStack) -> None:
    """`approvals deny ID --reason R` answers the call 77 with R; deciding again exits non-zero."""
    name = item()
    with ToolClient(stack.redis.url) as client:
        handle = client.submit("delete_item", {"item": name})
        wait_parked(stack, handle.call_id)
        denied = cli(stack, "deny", handle.call_id, "--reason", "wrong account")
        assert denied.returncode == 0, denied.stderr
        result = handle.get(timeout=30)
    assert result.exit_code == 77 and "wrong account" in (result.error or {})["message"]
    again = cli(stack, "approve", handle.call_id)
    assert again.returncode != 0 and "denied" in again.stderr
    assert stack.hits(f"/echo/delete/{name}") == 0


def test_parked_call_survives_worker_and_gateway_restarts(stack: ApprovalStack) -> None:
    """Parked while the worker and the gateway restart, the call is still listed and not sent; approved
    afterwards, it runs exactly once."""
    name = item()
    call_id = rest_call(stack, "delete_item", name).json()["callId"]
    wait_parked(stack, call_id)
    stack.worker.kill()
    stack.worker.wait(10)
    stack.gateway.stop()
    stack.gateway = stack.gateway.restart()
    stack.worker = start_worker(stack.worker_env, stack.directory / "worker.log")
    wait_listening(stack.gateway, ready=True)
    assert call_id in listed(stack) and stack.hits(f"/echo/delete/{name}") == 0
    assert decide(stack, call_id, "approve").status_code == 200
    assert envelope(stack, call_id)["exitCode"] == 0
    assert rest_call(stack, "read_item", item()).status_code == 200  # the fleet has moved on meanwhile
    assert stack.hits(f"/echo/delete/{name}") == 1


# --- MCP -------------------------------------------------------------------------------------------------


def answering(action: str, asked: list[str]) -> Any:
    async def elicitation(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action=action)  # type: ignore[arg-type]

    return elicitation


# How each generation is asked: 2026-07-28 over Streamable HTTP (an input_required result, answered on
# the retry); the handshake generation where a request can carry a server-to-client request, i.e. on a
# session: stdio (the gateway's HTTP transport is stateless, so that any process answers any request).
WAYS = [("auto", "http"), ("auto", "stdio"), ("legacy", "stdio")]


@asynccontextmanager
async def mcp_client(
    stack: ApprovalStack, mode: str, callback: Any = None, over: str = "http"
) -> AsyncIterator[Client]:
    if over == "stdio":
        env = gateway_env(stack.redis.url, DEFINITIONS)
        params = StdioServerParameters(command=sys.executable, args=["-m", "worker", "mcp"], env=env)
        async with Client(params, mode=mode, elicitation_callback=callback) as client:
            yield client
        return
    async with httpx2.AsyncClient(headers=auth(), timeout=30) as http:
        transport = streamable_http_client(stack.url + "/mcp", http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=callback) as client:
            yield client


@pytest.mark.parametrize(("mode", "over"), WAYS)
async def test_mcp_client_accepting_runs_the_call_once(stack: ApprovalStack, mode: str, over: str) -> None:
    """The human is asked through the client before anything is enqueued; accepted, the call runs once and
    the audit trail records who approved."""
    name, asked = item(), []
    async with mcp_client(stack, mode, answering("accept", asked), over) as client:
        result = await client.call_tool("delete_item", {"item": name})
    assert result.is_error is False, text_of(result)
    assert len(asked) == 1 and f"/echo/delete/{name}" in asked[0]
    assert stack.hits(f"/echo/delete/{name}") == 1
    call_id = result.meta[CALL_META_KEY]["callId"]  # type: ignore[index]
    decided = [r for r in audit_records(stack) if r.get("callId") == call_id and r.get("decision")]
    assert [(r["principal"], r["decision"]) for r in decided] == [("token-1" if over == "http" else "local", "approve")]


@pytest.mark.parametrize(("mode", "over"), WAYS)
@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_mcp_client_declining_sends_nothing(stack: ApprovalStack, mode: str, over: str, action: str) -> None:
    """Declined (or dismissed), the call is never enqueued: a tool error says so, the upstream saw nothing."""
    name, asked = item(), []
    async with mcp_client(stack, mode, answering(action, asked), over) as client:
        result = await client.call_tool("peek_item", {"item": name})
    assert result.is_error is True and "not sent" in text_of(result)
    assert len(asked) == 1
    assert stack.hits(f"/echo/peek/{name}") == 0
    assert not [row for row in listed(stack).values() if row["arguments"] == {"item": name}]


@pytest.mark.parametrize(("mode", "callback"), [("auto", False), ("legacy", False), ("legacy", True)])
async def test_mcp_client_that_cannot_be_asked_is_told_how_approval_is_granted(
    stack: ApprovalStack, mode: str, callback: bool
) -> None:
    """A client without elicitation (or a handshake-era one over the stateless HTTP transport, which no
    server-to-client request can reach) gets a tool error naming the ways to approve; nothing is sent."""
    name, asked = item(), []
    async with mcp_client(stack, mode, answering("accept", asked) if callback else None) as client:
        result = await client.call_tool("delete_item", {"item": name})
        plain = await client.call_tool("read_item", {"item": name})
    assert result.is_error is True and "approve" in text_of(result) and "/v1/approvals" in text_of(result)
    assert plain.is_error is False and not asked
    assert stack.hits(f"/echo/delete/{name}") == 0 and stack.hits(f"/echo/read/{name}") == 1
