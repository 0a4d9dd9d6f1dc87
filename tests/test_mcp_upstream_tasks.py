"""Long MCP tools run as tasks on their server (SEP-2663, FastMCP 4's `io.modelcontextprotocol/tasks`): called
through real worker processes against a FastMCP 4 server started on loopback (tests/support/fastmcp_upstream.py,
run by FastMCP's own Python), which writes each start, end and cancellation of a tool's body to a ledger."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
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
from mcp.types import ElicitRequestParams, ElicitResult, TextContent

from tests.conftest import start_worker, stop_worker, wait_ready
from tests.support.gateway_stack import TOKEN, Gateway, auth, gateway_env, start_gateway
from tests.support.log_lines import log_events
from tests.support.mcp_servers import ROOT, AnsweringCaller, McpServerProcess
from tests.support.waiting import scaled, wait_until
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.mcp_client import task_records
from worker.mcp_client.relay import CallRelay
from worker.mcp_client.sessions import Sessions
from worker.mcp_client.spec import ServerSpec
from worker.protocol import Relay

pytestmark = [pytest.mark.timeout(240), pytest.mark.integration]

FASTMCP4 = ROOT / ".venv" / "task-clients" / "fastmcp4" / "bin" / "python"
SERVER = ROOT / "tests" / "support" / "fastmcp_upstream.py"
TASK_CLIENT = ROOT / "tests" / "support" / "task_clients" / "fastmcp_tasks_client.py"
TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@dataclass
class Stack:
    redis: EmbeddedRedis
    server: McpServerProcess
    ledger: Path
    definitions: Path
    env: dict[str, str]
    logs: Path

    def lines(self, tool: str) -> list[str]:
        """The ledger's lines about one tool, e.g. ["start brew", "done brew"]."""
        text = self.ledger.read_text() if self.ledger.exists() else ""
        return [line for line in text.splitlines() if line.endswith(" " + tool)]

    def recorded(self, call_id: str) -> bool:
        """The call's upstream task is stored with it (worker/mcp_client/task_records.py)."""
        with redis.Redis.from_url(self.redis.url) as client:
            return bool(client.exists(task_records.key_of(call_id)))

    def said(self, worker: str, event: str, call_id: str) -> bool:
        """The worker's log has the event for the call."""
        log = self.logs / f"{worker}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        return any(event in line and call_id in line for line in lines)

    def cancels(self, why: str) -> int:
        """How many tasks/cancel the workers sent, for this reason ("cancelled" or "deadline")."""
        events = [event for log in self.logs.glob("*.log") for event in log_events(log.read_text(errors="replace"))]
        return sum(1 for event in events if event.get("event") == "mcp.task_cancelled" and event.get("why") == why)

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        process = start_worker(self.env, log)
        wait_ready(process, log)
        return process


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not FASTMCP4.exists():
        pytest.skip("FastMCP 4's environment is missing: `make task-clients` builds .venv/task-clients/fastmcp4")
    folder = tmp_path_factory.mktemp("upstream-tasks")
    ledger = folder / "ledger.txt"
    port = free_port()
    server = McpServerProcess([str(FASTMCP4), str(SERVER), str(port), str(ledger)], port).start()
    definitions = folder / "definitions"
    definitions.mkdir()
    (definitions / "mcp.yaml").write_text(
        "upstreams:\n"
        f"  fm: {{mcp: {{url: '{server.url}'}}, timeout_seconds: 20, connect_timeout_seconds: 2}}\n"
        f"  fmt: {{mcp: {{url: '{server.url}', tasks: true, include: [nap]}}, timeout_seconds: 20}}\n"
    )
    redis = EmbeddedRedis(folder / "redis").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env.update(TOOLWORKER_REDIS_URL=redis.url, TOOLWORKER_DEFINITIONS=str(definitions), TOOLWORKER_METRICS_PORT="0")
    env.update(TOOLWORKER_STORE_POLL_SECONDS="0.5", TOOLWORKER_LEASE_SECONDS="2")
    stack = Stack(redis, server, ledger, definitions, env, folder)
    for name in ("fm", "fmt"):
        refresh = [sys.executable, "-m", "worker", "upstreams", "refresh", name]
        refreshed = subprocess.run(refresh, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert refreshed.returncode == 0, refreshed.stderr
    yield stack
    redis.stop()
    server.kill()


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.worker("worker")
    yield process
    stop_worker(process)


def test_a_task_only_tool_answers_through_the_fleet(stack: Stack, worker: subprocess.Popen[bytes]) -> None:
    """`brew` runs only as a task: the worker starts it, polls it to its end and answers its text, once."""
    with ToolClient(stack.redis.url) as client:
        answer = client.call("fm_brew", {"seconds": 1}, timeout=60)
    assert answer.exit_code == 0 and answer.result == "brewed for 1.0 s", answer.to_dict()
    assert stack.lines("brew").count("start brew") == 1


def test_a_tool_that_allows_tasks_is_one_where_the_upstream_asks_for_tasks(
    stack: Stack, worker: subprocess.Popen[bytes]
) -> None:
    """`nap` allows tasks: run inline through `fm`, as a task through `fmt` (`mcp: {tasks: true}`)."""
    with ToolClient(stack.redis.url) as client:
        inline = client.submit("fm_nap", {"seconds": 0.2}, timeout=60)
        tasked = client.submit("fmt_nap", {"seconds": 0.2}, timeout=60)
        answers = inline.get(timeout=60), tasked.get(timeout=60)
    assert [a.result for a in answers] == ["rested", "rested"], [a.to_dict() for a in answers]
    assert not stack.said("worker", "mcp.task_started", inline.call_id)
    assert stack.said("worker", "mcp.task_started", tasked.call_id)


def test_a_call_past_its_deadline_cancels_its_upstream_task(stack: Stack, worker: subprocess.Popen[bytes]) -> None:
    """The worker gives up at the call's deadline (28) and sends tasks/cancel: the tool's body is cancelled."""
    before = stack.lines("brew").count("cancelled brew")
    with ToolClient(stack.redis.url) as client:
        answer = client.call("fm_brew", {"seconds": 30}, timeout=3)
    assert answer.exit_code == 28, answer.to_dict()
    wait_until(lambda: stack.lines("brew").count("cancelled brew") == before + 1, 30, "the tool's body cancelled")
    # The worker logs it once the server answered tasks/cancel, which may come after the body's cancellation.
    wait_until(lambda: stack.said("worker", "mcp.task_cancelled", answer.call_id), 30, "the worker's tasks/cancel")


def test_a_failed_task_is_a_tool_error(stack: Stack, worker: subprocess.Popen[bytes]) -> None:
    """`spill`'s task ends `failed`: exit 22 with the server's message, sent once."""
    with ToolClient(stack.redis.url) as client:
        answer = client.call("fm_spill", {}, timeout=60)
    assert answer.exit_code == 22 and "the milk was spilt" in (answer.error or {}).get("message", ""), answer.to_dict()
    assert stack.lines("spill") == ["start spill"]


def test_image_and_structured_content_come_through_unchanged(stack: Stack, worker: subprocess.Popen[bytes]) -> None:
    """The task's result is mapped like a tools/call answer: its blocks in `content`, its structuredContent."""
    with ToolClient(stack.redis.url) as client:
        answer = client.call("fm_chart", {}, timeout=60)
    assert answer.exit_code == 0, answer.to_dict()
    assert answer.structured == {"points": 3, "title": "tiny"}, answer.to_dict()
    images = [block for block in answer.content or [] if block.get("type") == "image"]
    assert images == [{"type": "image", "data": TINY_PNG, "mimeType": "image/png"}], answer.content


def test_a_worker_killed_while_it_polls_is_replaced_by_one_that_polls_the_same_task(
    stack: Stack, worker: subprocess.Popen[bytes]
) -> None:
    """kill -9 of the worker waiting on `brew`'s task: another worker finds the task's id with the call and
    polls that task to its end; the server ran the tool once."""
    before, done_before = stack.lines("brew").count("start brew"), stack.lines("brew").count("done brew")
    other = stack.worker("other")
    workers = {"worker": worker, "other": other}
    try:
        with ToolClient(stack.redis.url) as client:
            handle = client.submit("fm_brew", {"seconds": 6}, timeout=90)
            wait_until(lambda: stack.recorded(handle.call_id), 30, "the upstream task recorded")
            # The server answers with the task before its body starts (and writes its line): a busy machine shows it.
            started = lambda: stack.lines("brew").count("start brew") == before + 1  # noqa: E731
            wait_until(started, 30, "the tool's body started")
            # The task is recorded before the worker's log line about it is written.
            said = lambda name: stack.said(name, "mcp.task_started", handle.call_id)  # noqa: E731
            wait_until(lambda: any(said(name) for name in workers), 30, "a worker's log line of the task")
            polling = next(name for name in workers if stack.said(name, "mcp.task_started", handle.call_id))
            workers[polling].send_signal(signal.SIGKILL)
            workers[polling].wait(10)
            answer = handle.get(timeout=90)
        survivor = next(name for name in workers if name != polling)
        assert stack.said(survivor, "mcp.task_resumed", handle.call_id), f"{survivor}: no resumed poll"
    finally:
        if other.poll() is None:
            stop_worker(other)
    assert answer.exit_code == 0 and answer.result == "brewed for 6.0 s", answer.to_dict()
    assert stack.lines("brew").count("start brew") == before + 1, stack.lines("brew")
    assert stack.lines("brew").count("done brew") == done_before + 1, stack.lines("brew")


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> Iterator[Gateway]:
    """A gateway, and a worker of its own (the module's may have been killed)."""
    process = stack.worker("gateway-worker")
    env = gateway_env(stack.redis.url, stack.definitions, TOOLWORKER_STORE_POLL_SECONDS="0.5")
    started = start_gateway(env, stack.logs / "gateway.log")
    yield started
    started.stop()
    stop_worker(process)


def test_cancelling_a_running_call_cancels_its_upstream_task(stack: Stack, gateway: Gateway) -> None:
    """DELETE /v1/calls/{id} of a call waiting on `brew`'s task: the worker sends tasks/cancel (the server's
    tool body is cancelled) and the call ends 75."""
    before = stack.lines("brew").count("cancelled brew")
    with httpx2.Client(base_url=gateway.url, headers=auth(), timeout=60) as http:
        body = {"tool": "fm_brew", "arguments": {"seconds": 30}, "wait": False, "timeoutSeconds": 90}
        started = http.post("/v1/calls", json=body)
        assert started.status_code == 202, started.text
        call_id = started.json()["callId"]
        wait_until(lambda: stack.recorded(call_id), 30, "the upstream task recorded")
        cancelled = http.delete(f"/v1/calls/{call_id}")
        assert cancelled.status_code == 200 and cancelled.json()["cancelled"] is True, cancelled.text
        answer = http.get(f"/v1/calls/{call_id}", params={"waitSeconds": 30}).json()
    assert answer["exitCode"] == 75 and "cancelled" in answer["error"]["message"], answer
    wait_until(lambda: stack.lines("brew").count("cancelled brew") > before, 30, "the server's tool body cancelled")


def run_task_client(gateway: Gateway, action: str, **extra: object) -> dict[str, Any]:
    """One step of FastMCP 4's own task client against the gateway (tests/support/task_clients/)."""
    command = {"url": gateway.url + "/mcp", "token": TOKEN, "action": action, "timeout": 10, **extra}
    done = subprocess.run(
        [str(FASTMCP4), str(TASK_CLIENT), json.dumps(command)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in seen, seen
    return seen


def test_the_upstream_task_status_is_the_status_of_our_task(stack: Stack, gateway: Gateway) -> None:
    """A task through the gateway whose call waits on `brew`'s task: tasks/get shows brew's progress message."""
    # Long enough for a few looks from task-client processes, which start slowly on a busy machine.
    seconds = min(round(scaled(8)), 60)
    handle = {"tool": "fm_brew", "arguments": {"seconds": seconds}}
    created = run_task_client(gateway, "start", **handle)["created"]
    assert isinstance(created, dict)
    messages: list[str] = []

    def shows_progress() -> bool:
        status = run_task_client(gateway, "status", tool="fm_brew", created=created)["status"]
        assert isinstance(status, dict)
        messages.append(str(status.get("statusMessage")))
        return "brew: step" in messages[-1]

    try:
        wait_until(shows_progress, 30, "the upstream's status message")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the task's status messages were {messages}") from None
    result = run_task_client(gateway, "result", tool="fm_brew", created=created)["result"]
    assert result == {"isError": False, "texts": [f"brewed for {seconds:.1f} s"], "meta": result["meta"]}, result


def test_the_gateway_s_tasks_cancel_cancels_the_upstream_task(stack: Stack, gateway: Gateway) -> None:
    """FastMCP 4's task client cancels a task through the gateway whose call waits on `brew`'s task: our task
    is `cancelled`, and so is the server's (its tool body cancelled)."""
    before, sent = stack.lines("brew").count("cancelled brew"), stack.cancels("cancelled")
    created = run_task_client(gateway, "start", tool="fm_brew", arguments={"seconds": 30})["created"]
    assert isinstance(created, dict)
    wait_until(lambda: stack.recorded(str(created["taskId"])), 30, "the upstream task recorded")
    seen = run_task_client(gateway, "cancel", tool="fm_brew", created=created)
    assert seen["cancelled"] is True and seen["status"]["status"] == "cancelled", seen
    wait_until(lambda: stack.lines("brew").count("cancelled brew") > before, 30, "the server's tool body cancelled")
    wait_until(lambda: stack.cancels("cancelled") > sent, 30, "the worker's log line of its tasks/cancel")
    assert stack.cancels("cancelled") == sent + 1


async def abandoned_call(gateway: Gateway, name: str, arguments: dict[str, object], after_s: float) -> None:
    """The SDK's Client (2025-11-25) gives up on a `tools/call` after `after_s`: it sends notifications/cancelled."""
    async with httpx2.AsyncClient(headers=auth(), timeout=60) as http:
        transport = streamable_http_client(gateway.url + "/mcp", http_client=http)
        async with Client(transport, mode="legacy") as client:
            with pytest.raises(MCPError):
                await client.call_tool(name, arguments, read_timeout_seconds=after_s)


def test_a_client_that_cancels_its_tools_call_cancels_the_upstream_task(stack: Stack, gateway: Gateway) -> None:
    """notifications/cancelled of a direct tools/call whose call waits on `brew`'s task: tasks/cancel upstream,
    for that reason (not the call's deadline)."""
    before = stack.lines("brew").count("cancelled brew"), stack.cancels("cancelled")
    asyncio.run(abandoned_call(gateway, "fm_brew", {"seconds": 30}, 6))
    wait_until(lambda: stack.lines("brew").count("cancelled brew") > before[0], 30, "the server's tool body cancelled")
    # The worker logs its tasks/cancel once the server has answered it, which may be after the body stopped.
    wait_until(lambda: stack.cancels("cancelled") > before[1], 30, "the worker's tasks/cancel logged")
    assert stack.cancels("cancelled") == before[1] + 1


async def asked_through_the_gateway(gateway: Gateway, name: str, mode: str, answer: dict[str, Any]) -> list[str]:
    """The tool called by the SDK's Client through the gateway, accepting with `answer` what it is asked: the
    messages it was asked, and the result's text."""
    asked: list[str] = []

    async def on_elicit(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content=answer)

    async with httpx2.AsyncClient(headers=auth(), timeout=60) as http:
        transport = streamable_http_client(gateway.url + "/mcp", http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=on_elicit) as client:  # type: ignore[arg-type]
            result = await client.call_tool(name, {})
    assert not result.is_error, result
    return [*asked, "\n".join(block.text for block in result.content if isinstance(block, TextContent))]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_task_that_asks_for_input_asks_the_caller_and_goes_on(stack: Stack, gateway: Gateway, mode: str) -> None:
    """`roast`'s task waits for input (`input_required`, its question in `inputRequests`): the worker asks the
    MCP caller (on its stream, or by result on 2026-07-28), answers with tasks/update, and the task ends with
    the answer, its body run to the end once."""
    before = stack.lines("roast").count("done roast")
    asked = asyncio.run(asked_through_the_gateway(gateway, "fm_roast", mode, {"roast": "dark"}))
    assert asked == ["Which roast?", "roast: dark"], asked
    assert stack.lines("roast").count("done roast") == before + 1


def test_a_task_that_asks_a_caller_who_cannot_answer_is_declined(stack: Stack, worker: subprocess.Popen[bytes]) -> None:
    with ToolClient(stack.redis.url) as client:
        answer = client.call("fm_roast", {}, timeout=60)
    assert answer.exit_code == 0 and answer.result == "roast: decline", answer.to_dict()
    assert "cannot be asked during a call, so the request was declined" in (answer.note or ""), answer.to_dict()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_servers_input_round_within_a_call_is_asked_of_the_caller(gateway: Gateway, mode: str) -> None:
    """`pick` (no task) answers its `tools/call` with `input_required`: the caller is asked, and the retry
    carries its answer."""
    asked = asyncio.run(asked_through_the_gateway(gateway, "fm_pick", mode, {"flavour": "pistachio"}))
    assert asked == ["Which flavour?", "flavour: pistachio"], asked


def test_a_servers_input_round_for_a_caller_who_cannot_answer_is_declined(
    stack: Stack, worker: subprocess.Popen[bytes]
) -> None:
    """On the process's shared session: the round is this call's own, declined for it, and said in its note."""
    with ToolClient(stack.redis.url) as client:
        answer = client.call("fm_pick", {}, timeout=60)
    assert answer.exit_code == 0 and answer.result == "flavour: decline", answer.to_dict()
    assert "cannot be asked during a call" in (answer.note or ""), answer.to_dict()


async def test_a_2026_server_asks_a_listening_caller_on_the_shared_session(stack: Stack) -> None:
    """Its questions are the call's own: a caller that can answer them needs no session (no discovery, no
    handshake) of its own, and one that wants log messages still gets one."""
    sessions = Sessions()
    spec = ServerSpec(name="fm", url=stack.server.url, timeout_s=20)
    caller = AnsweringCaller({"flavour": "vanilla"})
    try:
        for _ in range(3):
            relay = CallRelay(caller, Relay(elicitation=["form"]))
            result = await sessions.call_tool(spec, "pick", {}, 20, relay)
            assert [block.text for block in result.content if isinstance(block, TextContent)] == ["flavour: vanilla"]
        assert sessions.handshakes == 1 and caller.asked == ["Which flavour?"] * 3, (sessions.handshakes, caller.asked)
        listening = CallRelay(caller, Relay(elicitation=["form"], logLevel="info"))
        await sessions.call_tool(spec, "pick", {}, 20, listening)
        assert sessions.handshakes == 2
    finally:
        await sessions.close()
