"""MCP tasks through real task clients: FastMCP 4's SEP-2663 client (2026-07-28 tasks extension) and the `mcp`
SDK 1.x's experimental task API (2025-11-25), each from a side environment (`make task-clients`), against two
gateway processes on one Redis, a real worker and a local upstream.

Each client step is its own process and its own connection (tests/support/task_clients/): a task started
through gateway A is read, awaited and cancelled by a new client on gateway B. The long call lasts
SLOW_CALL_S = 20 s (the issue's), four times the clients' own request timeout (5 s): a client that held
its request open for the result would have given up on it. It is also as long as the gateways' timeout of
a direct call (20 s here): a task's call has the task's TTL instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import FIXTURES, start_worker, stop_worker, worker_env
from tests.support.gateway_stack import OTHER_TOKEN, TOKEN, Gateway, auth, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from tests.support.waiting import scaled, wait_until
from worker.dev.embedded import EmbeddedRedis

# Generous: the first test may build the side environments (`make task-clients`) in its setup.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / "tests" / "support" / "task_clients"
SIDE_ENVS = ROOT / ".venv" / "task-clients"
DEFINITIONS = FIXTURES / "tasks"
HELD_QUEUE = "tasks-held"
SLOW_CALL_S = 20
CLIENT_TIMEOUT_S = 5
# Long enough for a new client process to cancel it while it runs (a client starts in about 3 s here, far
# slower on a busy machine: stretched by its load, within the slow tool's 60 s upstream timeout).
RUNNING_CALL_S = 15
RUNNING_CALL_MAX_S = 45
# How long a worker started by a test may take to come up and answer a call queued for it, stretched by the
# machine's load (15 to 25 s on a busy machine): the call it answers is given as long.
WORKER_START_S = 60
TASK_ID = re.compile(r"^[0-9a-f]{32}$")
KINDS = ("fastmcp4", "mcp1")


@dataclass
class TaskStack:
    redis: EmbeddedRedis
    upstream: UpstreamState
    a: Gateway
    b: Gateway
    worker_env: dict[str, str]
    directory: Path


@pytest.fixture(scope="session")
def task_clients() -> dict[str, Path]:
    """The side environments' Pythons, built by the Makefile's `task-clients` target when missing."""
    subprocess.run(["make", "-s", "task-clients"], cwd=ROOT, check=True, capture_output=True, timeout=900)
    return {"fastmcp4": SIDE_ENVS / "fastmcp4" / "bin" / "python", "mcp1": SIDE_ENVS / "mcp1" / "bin" / "python"}


@pytest.fixture(scope="module")
def stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TaskStack]:
    """A Redis of its own, a worker on tests/fixtures/tasks, the upstream, and two gateways with two tokens."""
    directory = tmp_path_factory.mktemp("tasks")
    server = EmbeddedRedis(directory / "redis").start()
    state = UpstreamState()
    upstream = ServerThread(make_upstream(state)).start()
    env = worker_env(server.url, upstream.url, dns_server.address, DEFINITIONS)
    worker = start_worker(env, directory / "worker.log")
    gateways: list[Gateway] = []
    try:
        # The gateways' timeout of a direct call stays gateway_env's 20 s: a task's call has its TTL instead.
        genv = gateway_env(server.url, DEFINITIONS)
        gateways = [start_gateway(genv, directory / f"gateway-{name}.log") for name in "ab"]
        wait_listening(gateways[0], ready=True)
        yield TaskStack(server, state, gateways[0], gateways[1], env, directory)
    finally:
        for gateway in gateways:
            gateway.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


def run_client(python: Path, kind: str, gateway: Gateway, action: str, token: str = TOKEN, **extra: Any) -> Any:
    """One step by a new client process (its own connection); what it saw, as JSON."""
    script = CLIENTS / ("fastmcp_tasks_client.py" if kind == "fastmcp4" else "mcp_v1_client.py")
    command = {"url": gateway.url + "/mcp", "token": token, "action": action, "timeout": CLIENT_TIMEOUT_S, **extra}
    done = subprocess.run(
        [str(python), str(script), json.dumps(command)],
        capture_output=True,
        text=True,
        timeout=max(SLOW_CALL_S * 4, command["timeout"] + 30),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    with (gateway.log_path.parent / "task-clients.jsonl").open("a") as transcript:  # what each client saw
        transcript.write(json.dumps({"client": kind, "command": {**command, "token": "…"}, "seen": seen}) + "\n")
    return seen


def start(clients: dict[str, Path], kind: str, gateway: Gateway, tool: str, arguments: dict[str, Any]) -> Any:
    """A task started by one client, which then disconnects; the step's output (with `handle` for the next)."""
    seen = run_client(clients[kind], kind, gateway, "start", tool=tool, arguments=arguments)
    assert "error" not in seen, seen
    created = seen["created"]
    task = created if kind == "fastmcp4" else created["task"]
    return {**seen, "task": task, "handle": {"tool": tool, "created": created, "taskId": task["taskId"]}}


def status_of(clients: dict[str, Path], kind: str, gateway: Gateway, handle: dict[str, Any], token: str = TOKEN) -> Any:
    action = "status" if kind == "fastmcp4" else "get"
    return run_client(clients[kind], kind, gateway, action, token, **handle)


def task_fields(kind: str, seen: dict[str, Any]) -> dict[str, Any]:
    """The task in a status step's output (FastMCP: `status`; mcp 1.x: `task`)."""
    return dict(seen["status"] if kind == "fastmcp4" else seen["task"])


@pytest.mark.parametrize("kind", KINDS)
def test_a_long_call_outlives_its_client(task_clients: dict[str, Path], stack: TaskStack, kind: str) -> None:
    """A 20 s call started as a task through gateway A is fetched by a new client on gateway B after the first
    client disconnected, and it reached the upstream once."""
    marker = f"{kind}-{uuid.uuid4().hex[:8]}"
    started = start(task_clients, kind, stack.a, "slow", {"delay": SLOW_CALL_S, "marker": marker})
    task = started["task"]
    assert TASK_ID.match(task["taskId"]) and task["status"] == "working"
    if kind == "fastmcp4":
        assert {"createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"} <= set(task)
        assert task["resultType"] == "task"
    else:
        assert {"createdAt", "lastUpdatedAt", "ttl", "pollInterval"} <= set(task)
        assert started["capabilities"]["requests"]["tools"]["call"] == {}
    meanwhile = task_fields(kind, status_of(task_clients, kind, stack.b, started["handle"]))
    assert meanwhile["status"] == "working" and meanwhile["taskId"] == task["taskId"]
    fetched = run_client(task_clients[kind], kind, stack.b, "result", timeout=SLOW_CALL_S * 3, **started["handle"])
    assert "error" not in fetched, fetched
    result = fetched["result"]
    if kind == "fastmcp4":
        assert result["isError"] is False and json.loads(result["texts"][0]) == {"slow": True}
    else:
        assert result["isError"] is False and json.loads(result["content"][0]["text"]) == {"slow": True}
        assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
        statuses = [n["params"] for n in fetched["notifications"] if n["method"] == "notifications/tasks/status"]
        assert statuses and statuses[-1]["status"] == "completed" and statuses[-1]["taskId"] == task["taskId"]
    ended = task_fields(kind, status_of(task_clients, kind, stack.a, started["handle"]))
    assert ended["status"] == "completed"
    assert stack.upstream.hits_to(f"/slow?delay={SLOW_CALL_S}&marker={marker}") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_call_is_a_completed_task(task_clients: dict[str, Path], stack: TaskStack, kind: str) -> None:
    """A call the upstream answers 500 is a completed task whose tool result has isError (not a failed task)."""
    started = start(task_clients, kind, stack.a, "status", {"code": 500})
    fetched = run_client(task_clients[kind], kind, stack.b, "result", timeout=60, **started["handle"])
    result = fetched["result"]
    texts = result["texts"] if kind == "fastmcp4" else [block["text"] for block in result["content"]]
    assert result["isError"] is True and "upstream says 500" in texts[0]
    ended = task_fields(kind, status_of(task_clients, kind, stack.b, started["handle"]))
    assert ended["status"] == "completed" and "exit code" in ended["statusMessage"]


@pytest.mark.parametrize("kind", KINDS)
def test_another_principal_cannot_see_the_task(task_clients: dict[str, Path], stack: TaskStack, kind: str) -> None:
    """A task is not found by another principal (nor cancelled by it), while its creator reads it."""
    item = f"other-{kind}-{uuid.uuid4().hex[:8]}"
    started = start(task_clients, kind, stack.a, "held_echo", {"item": item})
    foreign = status_of(task_clients, kind, stack.b, started["handle"], token=OTHER_TOKEN)
    assert foreign["error"]["code"] == -32602 and "not found" in foreign["error"]["message"], foreign
    cancelled = run_client(task_clients[kind], kind, stack.b, "cancel", OTHER_TOKEN, **started["handle"])
    assert "not found" in cancelled["error"]["message"], cancelled
    mine = task_fields(kind, status_of(task_clients, kind, stack.b, started["handle"]))
    assert mine["status"] == "working"
    unknown = {**started["handle"], "taskId": "0" * 32}
    unknown["created"] = {**started["handle"]["created"]}
    if kind == "fastmcp4":
        unknown["created"]["taskId"] = "0" * 32
    missing = status_of(task_clients, kind, stack.b, unknown)
    assert missing["error"]["message"] == foreign["error"]["message"].replace(started["handle"]["taskId"], "0" * 32)


def test_cancel_before_start_is_never_sent(task_clients: dict[str, Path], stack: TaskStack) -> None:
    """A task cancelled (through gateway B) before a worker took its call is cancelled, and its call never
    reaches the upstream once a worker for its queue starts; a call queued beside it does."""
    items = {kind: f"cancel-{kind}-{uuid.uuid4().hex[:8]}" for kind in KINDS}
    seen = {}
    for kind in KINDS:
        started = start(task_clients, kind, stack.a, "held_echo", {"item": items[kind]})
        seen[kind] = run_client(task_clients[kind], kind, stack.b, "cancel", **started["handle"])
    fastmcp, mcp1 = seen["fastmcp4"], seen["mcp1"]
    assert fastmcp["cancelled"] is True and fastmcp["status"]["status"] == "cancelled", fastmcp
    assert "never sent" in fastmcp["status"]["statusMessage"]
    assert mcp1["task"]["status"] == "cancelled" and "never sent" in mcp1["task"]["statusMessage"], mcp1
    control = f"control-{uuid.uuid4().hex[:8]}"
    # It waits for the worker started below: the gateway's 20 s for a call could run out before it is up (a
    # call taken past its deadline is not sent), so it gets as long as the test waits for it.
    call = {"tool": "held_echo", "arguments": {"item": control}, "timeoutSeconds": round(scaled(WORKER_START_S))}
    queued = httpx2.post(f"{stack.a.url}/v1/calls", json={**call, "wait": False}, headers=auth(), timeout=30)
    assert queued.status_code == 202, queued.text
    held_worker = start_worker(stack.worker_env, stack.directory / "held-worker.log", "-Q", HELD_QUEUE)
    try:
        wait_until(
            lambda: stack.upstream.hits_to(f"/echo/held/{control}") == 1,
            WORKER_START_S,
            f"the held worker to send {control}",
        )
    finally:
        stop_worker(held_worker)
    for item in items.values():
        assert stack.upstream.hits_to(f"/echo/held/{item}") == 0


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_while_running_is_reported_honestly(task_clients: dict[str, Path], stack: TaskStack, kind: str) -> None:
    """Cancelling a call already running upstream says it could not be stopped: 2026-07-28 keeps the task working
    until it completes; 2025-11-25 marks it cancelled and says the call ran on."""
    marker = f"running-{kind}-{uuid.uuid4().hex[:8]}"
    delay = round(min(scaled(RUNNING_CALL_S), RUNNING_CALL_MAX_S))
    started = start(task_clients, kind, stack.a, "slow", {"delay": delay, "marker": marker})
    wait_until(lambda: stack.upstream.hits_to(f"/slow?delay={delay}&marker={marker}") == 1, timeout_s=30)
    cancelled = run_client(task_clients[kind], kind, stack.b, "cancel", **started["handle"])
    if kind == "fastmcp4":
        assert cancelled["status"]["status"] == "working", cancelled
        assert "cannot be stopped" in cancelled["status"]["statusMessage"]
        fetched = run_client(task_clients[kind], kind, stack.b, "result", timeout=delay + 45, **started["handle"])
        assert fetched["result"]["isError"] is False
    else:
        assert cancelled["task"]["status"] == "cancelled", cancelled
        assert "could not be stopped" in cancelled["task"]["statusMessage"]


def test_tools_declare_their_task_support(task_clients: dict[str, Path], stack: TaskStack) -> None:
    """tools/list gives each tool's execution.taskSupport: a tool's own `task:`, else optional."""
    listed = run_client(task_clients["mcp1"], "mcp1", stack.a, "tools")
    support = {name: execution["taskSupport"] for name, execution in listed["tools"].items()}
    assert support.pop("catalog_search") == "optional"
    assert {name: support[name] for name in ("slow", "status", "held_echo", "only_task", "never_task")} == {
        "slow": "optional",
        "status": "optional",
        "held_echo": "optional",
        "only_task": "required",
        "never_task": "forbidden",
    }


def test_tasks_list_pages_a_principals_tasks(task_clients: dict[str, Path], stack: TaskStack) -> None:
    """tasks/list (2025-11-25) lists the tasks its principal created, and none of another's."""
    mine = start(task_clients, "mcp1", stack.a, "status", {"code": 200})
    theirs = run_client(
        task_clients["mcp1"], "mcp1", stack.a, "start", OTHER_TOKEN, tool="status", arguments={"code": 201}
    )
    listed = run_client(task_clients["mcp1"], "mcp1", stack.b, "list")
    ids = [task["taskId"] for task in listed["tasks"]["tasks"]]
    assert mine["handle"]["taskId"] in ids and theirs["created"]["task"]["taskId"] not in ids


# --- the protocol's edges, in raw JSON-RPC (2026-07-28: every request carries its envelope in `_meta`) ----------

MODERN = "2026-07-28"
OPTED_IN = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


def modern_request(
    method: str, params: dict[str, Any], capabilities: dict[str, Any] | None = None, **headers: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026-07-28 request's body and headers (`Mcp_Name=` for the Mcp-Name header)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    sent = {
        **auth(),
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        **{name.replace("_", "-"): value for name, value in headers.items()},
    }
    if method == "tools/call":
        sent["Mcp-Name"] = params["name"]
    return body, sent


def modern(
    gateway: Gateway, method: str, params: dict[str, Any], capabilities: dict[str, Any] | None = None, **headers: str
) -> dict[str, Any]:
    """One 2026-07-28 request, as JSON; the answer's JSON-RPC body (an error comes with HTTP 400, an unknown
    method with 404)."""
    body, sent = modern_request(method, params, capabilities, **headers)
    answer = httpx2.post(gateway.url + "/mcp", json=body, headers=sent, timeout=30)
    found = answer.json()
    expected = 200 if "error" not in found else 404 if found["error"]["code"] == -32601 else 400
    assert answer.status_code == expected, answer.text
    return dict(found)


def listen(gateway: Gateway, notifications: dict[str, Any]) -> list[dict[str, Any]]:
    """Every frame of a `subscriptions/listen` stream, to its end."""
    body, sent = modern_request("subscriptions/listen", {"notifications": notifications})
    frames = []
    with httpx2.stream("POST", gateway.url + "/mcp", json=body, headers=sent, timeout=60) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("data:") and line[5:].strip():
                frames.append(json.loads(line[5:]))
    return frames


def test_discover_advertises_the_tasks_extension(stack: TaskStack) -> None:
    """server/discover lists io.modelcontextprotocol/tasks among the server's extensions."""
    found = modern(stack.a, "server/discover", {})
    assert "io.modelcontextprotocol/tasks" in found["result"]["capabilities"]["extensions"]


def test_task_modes_are_enforced(stack: TaskStack) -> None:
    """A `task: required` tool refuses a call that did not opt in (-32021, naming the extension); a `forbidden`
    one answers an opted-in call at once; an optional one answers a call that did not opt in at once."""
    refused = modern(stack.a, "tools/call", {"name": "only_task", "arguments": {"item": "x"}})
    assert refused["error"]["code"] == -32021
    assert "io.modelcontextprotocol/tasks" in refused["error"]["data"]["requiredCapabilities"]["extensions"]
    tasked = modern(stack.a, "tools/call", {"name": "only_task", "arguments": {"item": "x"}}, OPTED_IN)
    assert tasked["result"]["resultType"] == "task" and tasked["result"]["status"] == "working"
    direct = modern(stack.a, "tools/call", {"name": "never_task", "arguments": {"item": "y"}}, OPTED_IN)
    assert direct["result"]["resultType"] == "complete" and direct["result"]["isError"] is False
    plain = modern(stack.a, "tools/call", {"name": "status", "arguments": {"code": 200}})
    assert plain["result"]["resultType"] == "complete"


def test_each_generation_serves_its_own_methods(stack: TaskStack) -> None:
    """tasks/result and tasks/list (2025-11-25 only) are not found for a 2026-07-28 client."""
    created = modern(stack.a, "tools/call", {"name": "status", "arguments": {"code": 200}}, OPTED_IN)["result"]
    assert modern(stack.b, "tasks/result", {"taskId": created["taskId"]})["error"]["code"] == -32601
    assert modern(stack.b, "tasks/list", {})["error"]["code"] == -32601


def test_mcp_name_must_name_the_task(stack: TaskStack) -> None:
    """A tasks/get whose Mcp-Name header names another task is refused (-32020); the right one is served."""
    created = modern(stack.a, "tools/call", {"name": "status", "arguments": {"code": 200}}, OPTED_IN)["result"]
    wrong = modern(stack.b, "tasks/get", {"taskId": created["taskId"]}, Mcp_Name="0" * 32)
    assert wrong["error"]["code"] == -32020
    right = modern(stack.b, "tasks/get", {"taskId": created["taskId"]}, Mcp_Name=created["taskId"])
    assert right["result"]["taskId"] == created["taskId"]


def test_input_requests_are_answered_with_tasks_update(stack: TaskStack) -> None:
    """A task in input_required shows its inputRequests inline in tasks/get; tasks/update stores the answers and
    puts it back to working; tasks/update on a working task is refused."""
    created = modern(stack.a, "tools/call", {"name": "held_echo", "arguments": {"item": "ask"}}, OPTED_IN)["result"]
    task_id = created["taskId"]
    refused = modern(stack.b, "tasks/update", {"taskId": task_id, "inputResponses": {"approval": {}}})
    assert refused["error"]["code"] == -32602
    client = redis.Redis.from_url(stack.redis.url)
    key = f"toolworker:gateway:task:{task_id}"
    record = json.loads(client.get(key))
    asked = {"approval": {"method": "elicitation/create", "params": {"message": "Send it?", "requestedSchema": {}}}}
    client.set(key, json.dumps({**record, "status": "input_required", "input_requests": asked}), keepttl=True)
    waiting = modern(stack.b, "tasks/get", {"taskId": task_id})["result"]
    assert waiting["status"] == "input_required" and waiting["inputRequests"] == asked
    answer = {"approval": {"action": "accept", "content": {}}}
    assert modern(stack.a, "tasks/update", {"taskId": task_id, "inputResponses": answer})["result"] == {
        "resultType": "complete",
        "_meta": waiting["_meta"],
    }
    assert modern(stack.b, "tasks/get", {"taskId": task_id})["result"]["status"] == "working"
    assert json.loads(client.get(key))["input_responses"] == answer


def test_a_forbidden_tool_refuses_a_task_augmented_call(task_clients: dict[str, Path], stack: TaskStack) -> None:
    """2025-11-25: `params.task` on a `task: forbidden` tool is refused (-32601), and nothing is enqueued."""
    refused = run_client(task_clients["mcp1"], "mcp1", stack.a, "start", tool="never_task", arguments={"item": "no"})
    assert refused["error"]["code"] == -32601 and "does not run as a task" in refused["error"]["message"]
    assert stack.upstream.hits_to("/echo/never/no") == 0


def test_listen_pushes_the_changes_of_a_task(stack: TaskStack) -> None:
    """A subscriptions/listen naming a task (on another gateway) is told of it as it changes, from working to
    completed with its result inline, then ends; a task id it may not read is never told of."""
    marker = f"listen-{uuid.uuid4().hex[:8]}"
    arguments = {"delay": 2, "marker": marker}
    created = modern(stack.a, "tools/call", {"name": "slow", "arguments": arguments}, OPTED_IN)["result"]
    frames = listen(stack.b, {"taskIds": [created["taskId"], "0" * 32]})
    acknowledged = frames[0]
    assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
    assert acknowledged["params"]["notifications"]["taskIds"] == [created["taskId"], "0" * 32]
    told = [frame["params"] for frame in frames if frame.get("method") == "notifications/tasks"]
    assert {task["taskId"] for task in told} == {created["taskId"]}
    assert told[0]["status"] == "working" and told[-1]["status"] == "completed"
    assert json.loads(told[-1]["result"]["content"][0]["text"]) == {"slow": True}
    assert frames[-1]["id"] == 1 and "result" in frames[-1]


def test_a_task_expires_after_its_ttl(task_clients: dict[str, Path], stack: TaskStack) -> None:
    """A task asked with a short TTL (2025-11-25 `params.task.ttl`) is kept that long, then not found."""
    seen = run_client(
        task_clients["mcp1"], "mcp1", stack.a, "start", tool="held_echo", arguments={"item": "ttl"}, ttl=1500
    )
    task = seen["created"]["task"]
    assert task["ttl"] == 1500
    client = redis.Redis.from_url(stack.redis.url)
    wait_until(lambda: not client.exists(f"toolworker:gateway:task:{task['taskId']}"), timeout_s=30)
    gone = run_client(task_clients["mcp1"], "mcp1", stack.b, "get", taskId=task["taskId"])
    assert gone["error"]["code"] == -32602 and "not found" in gone["error"]["message"]


async def test_a_required_tool_refuses_a_plain_legacy_call(stack: TaskStack) -> None:
    """2025-11-25: a `task: required` tool called without `params.task` is refused (-32601), naming the reason."""
    async with httpx2.AsyncClient(headers=auth(), timeout=30) as http:
        transport = streamable_http_client(stack.a.url + "/mcp", http_client=http)
        async with Client(transport, mode="legacy") as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("only_task", {"item": "plain"})
    assert refused.value.error.code == -32601 and "runs only as a task" in refused.value.error.message
    assert stack.upstream.hits_to("/echo/only/plain") == 0


def test_no_task_state_holds_a_token(task_clients: dict[str, Path], stack: TaskStack) -> None:
    """The task records and indexes name principals, never their tokens."""
    start(task_clients, "mcp1", stack.a, "status", {"code": 200})
    client = redis.Redis.from_url(stack.redis.url)
    texts = []
    for key in client.scan_iter("toolworker:gateway:task*"):
        kind = client.type(key)
        texts.append(client.get(key) if kind == b"string" else b" ".join(client.zrange(key, 0, -1)) + key)
    assert texts and b"principal" in b"".join(texts)
    assert not any(token.encode() in text for token in (TOKEN, OTHER_TOKEN) for text in texts)
