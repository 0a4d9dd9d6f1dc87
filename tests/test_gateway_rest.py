"""The native REST API: calls (wait, 202 then fetch, batches, withdrawal), the catalog, errors, security,
its own OpenAPI document imported into toolworker, and a gateway killed while calls are queued."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
import yaml

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import HELD_QUEUE, TOKEN, Stack, auth, gateway_env, start_gateway
from tests.support.servers import DnsServer
from tests.support.waiting import scaled
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def call(stack: Stack, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return httpx2.post(f"{stack.url}/v1/calls", json=body, headers={**auth(), **headers}, timeout=60)


def get(stack: Stack, path: str, **params: Any) -> httpx2.Response:
    return httpx2.get(f"{stack.url}{path}", params=params, headers=auth(), timeout=60)


def test_call_waits_for_its_envelope(gateway_stack: Stack) -> None:
    """POST /v1/calls answers 200 with the call's envelope, secrets redacted."""
    answer = call(gateway_stack, {"tool": "echo_get", "arguments": {"item": "r-1"}}, **{"X-User-Token": "u-secret-1"})
    envelope = answer.json()
    assert answer.status_code == 200 and envelope["exitCode"] == 0 and envelope["statusCode"] == 200
    assert envelope["headers"]["Authorization"] == "[redacted]" and envelope["headers"]["x-user-token"] == "[redacted]"
    assert "u-secret-1" not in answer.text and TOKEN not in answer.text


def test_an_idle_connection_outlives_a_clients_keep_alive(gateway_stack: Stack) -> None:
    """A connection left idle for longer than clients keep theirs (httpx: 5 s) still serves the next request on
    the same socket: the gateway never closes a connection that a pooled client may be sending on."""
    address = urlsplit(gateway_stack.url)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=30)
    try:
        ports = []
        for _ in range(2):
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            response.read()
            assert response.status in (200, 503)
            ports.append(connection.sock.getsockname()[1])
            time.sleep(6)
        assert ports[0] == ports[1]  # one connection, not a new one
    finally:
        connection.close()


def test_call_without_waiting_is_202_then_fetched(gateway_stack: Stack) -> None:
    """wait: false answers 202 with the callId at once; GET /v1/calls/{callId} waits for the envelope."""
    queued = call(gateway_stack, {"tool": "echo_post", "arguments": {"title": "later"}, "wait": False})
    assert queued.status_code == 202 and queued.json()["status"] == "pending"
    call_id = queued.json()["callId"]
    assert queued.headers["location"] == f"/v1/calls/{call_id}"
    fetched = get(gateway_stack, f"/v1/calls/{call_id}", waitSeconds=20)
    assert fetched.status_code == 200 and fetched.json()["callId"] == call_id and fetched.json()["exitCode"] == 0
    assert get(gateway_stack, f"/v1/calls/{call_id}").json() == fetched.json()


def test_pending_and_unknown_calls(gateway_stack: Stack) -> None:
    """A call that waits in its queue is 202 (also after waitSeconds); an unknown callId is 404."""
    held = call(gateway_stack, {"tool": "held_echo", "arguments": {"item": "pending"}, "waitSeconds": 0.2})
    assert held.status_code == 202
    call_id = held.json()["callId"]
    assert get(gateway_stack, f"/v1/calls/{call_id}", waitSeconds=0.1).status_code == 202
    assert httpx2.delete(f"{gateway_stack.url}/v1/calls/{call_id}", headers=auth()).json()["withdrawn"] is True
    unknown = get(gateway_stack, f"/v1/calls/{uuid.uuid4()}")
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "unknown_call"


def test_withdraw_only_what_has_not_started(gateway_stack: Stack) -> None:
    """DELETE takes a waiting call off its queue (once); an answered call is 409; an unknown one 404."""
    queued = call(gateway_stack, {"tool": "held_echo", "arguments": {"item": "w"}, "wait": False}).json()
    url = f"{gateway_stack.url}/v1/calls/{queued['callId']}"
    assert httpx2.delete(url, headers=auth()).status_code == 200
    assert httpx2.delete(url, headers=auth()).status_code == 404
    answered = call(gateway_stack, {"tool": "echo_get", "arguments": {"item": "done"}}).json()
    late = httpx2.delete(f"{gateway_stack.url}/v1/calls/{answered['callId']}", headers=auth())
    assert late.status_code == 409 and late.json()["error"]["type"] == "already_started"


def test_same_call_id_is_answered_from_the_first_call(gateway_stack: Stack) -> None:
    """A callId sent again gets the first envelope, the upstream called once; other arguments: 409."""
    call_id = f"rest-{uuid.uuid4().hex}"
    body = {"tool": "echo_post", "arguments": {"title": call_id}, "callId": call_id}
    first = call(gateway_stack, body)
    hits = len(gateway_stack.upstream_state.hits)
    again = call(gateway_stack, body)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    assert len(gateway_stack.upstream_state.hits) == hits
    other = call(gateway_stack, {**body, "arguments": {"title": "other"}})
    assert other.status_code == 409 and other.json()["error"]["type"] == "call_id_conflict"


def test_batch_answers_in_order(gateway_stack: Stack) -> None:
    """POST /v1/batches runs its calls together; each answer is in place, an unknown tool's as exit 64."""
    calls = [
        {"tool": "echo_get", "arguments": {"item": "b1"}},
        {"tool": "no_such_tool"},
        {"tool": "status", "arguments": {"code": 404}},
    ]
    answer = httpx2.post(f"{gateway_stack.url}/v1/batches", json={"calls": calls}, headers=auth(), timeout=60)
    results = answer.json()["results"]
    assert answer.status_code == 200 and [r["exitCode"] for r in results] == [0, 64, 22]
    assert results[1]["error"]["type"] == "unknown_tool"


def test_catalog_routes(gateway_stack: Stack) -> None:
    """List (by tag), search, one tool's definition, and exports in OpenAI, Anthropic and MCP shapes."""
    listed = get(gateway_stack, "/v1/tools", tag="status").json()
    assert [t["name"] for t in listed["tools"]] == ["status"] and listed["version"] == 0
    found = get(gateway_stack, "/v1/tools/search", question="delete an item", top_k=1).json()["tools"]
    assert found[0]["name"] == "echo_delete" and "score" in found[0]
    tool = get(gateway_stack, "/v1/tools/echo_get").json()
    assert tool["inputSchema"]["required"] == ["item"] and tool["method"] == "GET"
    openai = get(gateway_stack, "/v1/tools", tag="read", format="openai").json()["tools"]
    anthropic = get(gateway_stack, "/v1/tools", tag="read", format="anthropic").json()["tools"]
    mcp = get(gateway_stack, "/v1/tools", tag="read", format="mcp").json()["tools"]
    assert {t["function"]["name"] for t in openai} == {t["name"] for t in anthropic} == {"echo_get", "whoami"}
    assert all("input_schema" in t for t in anthropic) and all("annotations" in t for t in mcp)
    assert get(gateway_stack, "/v1/tools/nope").status_code == 404
    assert get(gateway_stack, "/v1/tools", format="yaml").status_code == 422
    assert get(gateway_stack, "/v1/tools/search").status_code == 422


def test_malformed_requests_get_clear_json_errors(gateway_stack: Stack) -> None:
    """Not JSON: 400; the wrong shape: 422 naming the field; too large: 413; no route: 404."""
    url = f"{gateway_stack.url}/v1/calls"
    not_json = httpx2.post(url, content=b"{nope", headers=auth())
    wrong = httpx2.post(url, json={"tool": 5, "extra": 1}, headers=auth())
    huge = httpx2.post(url, content=b"x" * (3 * 1024 * 1024), headers=auth())
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request"
    assert wrong.status_code == 422
    fields = {problem["field"] for problem in wrong.json()["error"]["problems"]}
    assert fields == {"tool", "extra"}
    assert huge.status_code == 413 and huge.json()["error"]["type"] == "too_large"
    assert get(gateway_stack, "/v2/nothing").json()["error"]["type"] == "not_found"


def test_health_metrics_and_tokens(gateway_stack: Stack) -> None:
    """/healthz needs no token; everything else does; /metrics counts the calls by exit code."""
    health = httpx2.get(f"{gateway_stack.url}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert httpx2.get(f"{gateway_stack.url}/v1/tools").status_code == 401
    assert httpx2.get(f"{gateway_stack.url}/metrics").status_code == 401
    metrics = get(gateway_stack, "/metrics").text
    assert 'toolworker_gateway_calls_total{exit_code="0",front="rest"}' in metrics


def test_no_secret_in_the_gateway_log(gateway_stack: Stack) -> None:
    """Neither the gateway's tokens nor a client's session header value ever reach its log."""
    call(gateway_stack, {"tool": "whoami"}, **{"X-User-Token": "session-secret-77"})
    log = gateway_stack.gateway.log_text()
    assert TOKEN not in log and "session-secret-77" not in log and "gw-token" not in log


def test_openapi_document_imports_and_calls_through(
    gateway_stack: Stack, dns_server: DnsServer, tmp_path: Path
) -> None:
    """`toolworker import-openapi` of /v1/openapi.json gives tools that call the gateway, through a worker."""
    spec = tmp_path / "gateway.json"
    spec.write_text(get(gateway_stack, "/v1/openapi.json").text)
    definitions = tmp_path / "definitions"
    definitions.mkdir()
    out = definitions / "gateway.yaml"
    argv = ["import-openapi", str(spec), "--upstream", "gateway", "--base-url", gateway_stack.url, "-o", str(out)]
    subprocess.run([sys.executable, "-m", "worker", *argv], check=True, capture_output=True, timeout=60)
    document = yaml.safe_load(out.read_text())
    assert {t["name"] for t in document["tools"]} >= {"createCall", "getCall", "listTools", "searchTools", "getTool"}
    document["upstreams"]["gateway"]["headers"] = {"Authorization": "Bearer ${env:GATEWAY_TOKEN}"}
    out.write_text(yaml.safe_dump(document))
    server = EmbeddedRedis(tmp_path / "redis").start()
    env = worker_env(server.url, gateway_stack.upstream_url, dns_server.address, definitions) | {"GATEWAY_TOKEN": TOKEN}
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        with ToolClient(server.url) as client:
            outer = client.call("createCall", {"tool": "echo_get", "arguments": {"item": "via-openapi"}}, timeout=60)
            listed = client.call("listTools", {"tag": ["status"]}, timeout=30)
    finally:
        stop_worker(worker)
        server.stop()
    assert outer.exit_code == 0, outer.to_dict()
    inner = yaml.safe_load(outer.result)
    assert inner["exitCode"] == 0 and '"/echo/items/via-openapi"' in inner["result"]
    assert listed.exit_code == 0 and '"status"' in listed.result


def test_killed_gateway_restarted_answers_the_queued_calls(
    gateway_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Calls queued by a gateway killed with SIGKILL are answered, and a resend gets the same envelope."""
    directory = tmp_path_factory.mktemp("restart")
    gateway = start_gateway(gateway_env(gateway_stack.redis.url), directory / "gateway.log")
    items = [f"held-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    # Deadlines long enough for the held worker started below, which starts slowly on a busy machine.
    timeout_s = round(scaled(60))
    bodies = [
        {
            "tool": "held_echo",
            "arguments": {"item": item},
            "callId": f"call-{item}",
            "wait": False,
            "timeoutSeconds": timeout_s,
        }
        for item in items
    ]
    for body in bodies:
        queued = httpx2.post(f"{gateway.url}/v1/calls", json=body, headers=auth(), timeout=30)
        assert queued.status_code == 202
    gateway.kill()
    held_worker = start_worker(gateway_stack.worker_env, directory / "held-worker.log", "-Q", HELD_QUEUE)
    restarted = gateway.restart()
    try:
        envelopes = []
        for body in bodies:
            fetched = httpx2.get(
                f"{restarted.url}/v1/calls/{body['callId']}?waitSeconds={timeout_s}",
                headers=auth(),
                timeout=timeout_s + 30,
            )
            assert fetched.status_code == 200, fetched.text
            envelopes.append(fetched.json())
            again = httpx2.post(
                f"{restarted.url}/v1/calls", json={**body, "wait": True}, headers=auth(), timeout=timeout_s + 30
            )
            assert again.status_code == 200 and again.json() == fetched.json()
    finally:
        restarted.stop()
        stop_worker(held_worker)
    assert [e["exitCode"] for e in envelopes] == [0, 0, 0]
    for item in items:
        assert gateway_stack.upstream_state.hits_to(f"/echo/held/{item}") == 1


def test_a_call_is_answered_only_to_its_principal_and_operators(
    gateway_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """GET and DELETE /v1/calls/{callId} answer the principal that made the call and one with `operate`;
    another principal gets 404, as for a call that never was, and cannot reuse the callId (409)."""
    directory = tmp_path_factory.mktemp("owners")
    access = directory / "access.yaml"
    alice, bob, ops = "alice-token-4d1f9", "bob-token-a72c0", "ops-token-93be1"
    access.write_text(
        "tokens:\n"
        f'  alice: {{token: "{alice}", tools: ["*"]}}\n'
        f'  bob: {{token: "{bob}", tools: ["*"]}}\n'
        f'  ops: {{token: "{ops}", tools: ["*"], grants: [operate]}}\n'
    )
    env = gateway_env(gateway_stack.redis.url, TOOLWORKER_GATEWAY_ACCESS=str(access), TOOLWORKER_GATEWAY_TOKENS="")
    gateway = start_gateway(env, directory / "gateway.log")

    def send(method: str, path: str, token: str, **kwargs: Any) -> httpx2.Response:
        return httpx2.request(method, f"{gateway.url}{path}", headers=auth(token), timeout=60, **kwargs)

    try:
        answered = send("POST", "/v1/calls", alice, json={"tool": "echo_get", "arguments": {"item": "mine"}})
        held_body = {"tool": "held_echo", "arguments": {"item": f"o-{uuid.uuid4().hex[:8]}"}, "wait": False}
        held = send("POST", "/v1/calls", alice, json=held_body).json()["callId"]
        done = answered.json()["callId"]
        assert answered.status_code == 200, answered.text
        for call_id in (done, held):
            unknown = send("GET", f"/v1/calls/{call_id}", bob)
            assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "unknown_call"
            assert send("DELETE", f"/v1/calls/{call_id}", bob).status_code == 404
        reused = send("POST", "/v1/calls", bob, json={**held_body, "callId": held})
        assert reused.status_code == 409 and reused.json()["error"]["type"] == "call_id_conflict"
        assert send("GET", f"/v1/calls/{done}", alice).json() == answered.json()
        assert send("GET", f"/v1/calls/{done}", ops).json() == answered.json()
        assert send("GET", f"/v1/calls/{held}", alice).status_code == 202
        assert send("DELETE", f"/v1/calls/{held}", ops).json() == {"callId": held, "withdrawn": True}
    finally:
        gateway.stop()
