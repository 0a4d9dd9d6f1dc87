"""Code mode at the gateway: `--mode code` over MCP with the SDK's own `Client` in both protocol generations,
REST `POST /v1/code`, grants inside programs, and programs over an imported OpenAPI catalog; a real worker,
a Redis-compatible server and the local upstream."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import FIXTURES, start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, auth, gateway_env, start_gateway, text_of, wait_listening
from tests.support.openapi_gen import write_spec
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from tests.support.waiting import scaled, wait_until
from worker.definitions import file_store
from worker.definitions.signatures import signature
from worker.dev.embedded import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
FULL_TOKEN = "code-full-token-0123"
NARROW_TOKEN = "code-narrow-token-42"
ACCESS = """
tokens:
  full: {token: "${env:TEST_FULL_TOKEN}", tools: ["*"]}
  narrow: {token: "${env:TEST_NARROW_TOKEN}", tools: ["run_code", "slow_item"]}
"""
GENERATIONS = ("legacy", "auto")


@dataclass
class CodeStack:
    gateway: Gateway
    upstream: UpstreamState
    env: dict[str, str]
    directory: Path


@pytest.fixture(scope="module")
def code_stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodeStack]:
    """A worker on tests/fixtures/code_mode plus a generated 40-operation OpenAPI catalog (reaching the echo
    upstream), and a `--mode code` gateway with a full and a narrow principal."""
    directory = tmp_path_factory.mktemp("code-gateway")
    definitions = directory / "definitions"
    shutil.copytree(FIXTURES / "code_mode", definitions)
    write_spec(definitions, 40)
    entry = '  - {upstream: generated, spec: generated.json, base_url: "${env:TEST_UPSTREAM_URL}/echo"}\n'
    (definitions / "generated-tools.yaml").write_text("openapi:\n" + entry)
    server = EmbeddedRedis(directory / "redis").start()
    state = UpstreamState()
    upstream = ServerThread(make_upstream(state)).start()
    worker = start_worker(worker_env(server.url, upstream.url, dns_server.address, definitions), directory / "w.log")
    access = directory / "access.yaml"
    access.write_text(ACCESS)
    extra = {"TOOLWORKER_GATEWAY_ACCESS": str(access), "TEST_FULL_TOKEN": FULL_TOKEN, "TEST_NARROW_TOKEN": NARROW_TOKEN}
    gateway = None
    try:
        env = gateway_env(server.url, definitions, TOOLWORKER_GATEWAY_MODE="code", **extra)
        gateway = start_gateway(env, directory / "gateway.log")
        wait_listening(gateway, ready=True)
        yield CodeStack(gateway, state, env, directory)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


@asynccontextmanager
async def client_of(stack: CodeStack, mode: str, token: str = FULL_TOKEN) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=auth(token), timeout=60) as http,
        Client(streamable_http_client(stack.gateway.url + "/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


async def meta(client: Client, name: str, arguments: dict[str, Any]) -> Any:
    result = await client.call_tool(name, arguments)
    assert result.is_error is False, result.content
    return json.loads(text_of(result))


@pytest.mark.parametrize("mode", GENERATIONS)
async def test_code_mode_lists_three_tools(code_stack: CodeStack, mode: str) -> None:
    """A code-mode client sees search_tools, get_tool_schema and run_code, not the catalog."""
    async with client_of(code_stack, mode) as client:
        listed = await client.list_tools()
    assert sorted(tool.name for tool in listed.tools) == ["get_tool_schema", "run_code", "search_tools"]


@pytest.mark.parametrize("mode", GENERATIONS)
async def test_a_model_finds_a_tool_reads_its_signature_and_runs_a_program(code_stack: CodeStack, mode: str) -> None:
    """search_tools, get_tool_schema (with a Python signature that parses), then run_code over the OpenAPI
    catalog: the value comes back as structuredContent, the printed text beside it."""
    async with client_of(code_stack, mode) as client:
        found = await meta(client, "search_tools", {"question": "fetch one resource item by id", "top_k": 3})
        name = next(row["name"] for row in found if row["name"].startswith("get"))
        schema = await meta(client, "get_tool_schema", {"names": [name, "no_such_tool"]})
        python = schema["tools"][0]["python"]
        assert python.startswith(f"async def {name}(") and schema["missing"] == ["no_such_tool"]
        ast.parse(python)
        code = f'r = await tools.{name}(itemId="abc")\nprint("path", r["path"])\n{{"path": r["path"], "n": 1}}'
        result = await client.call_tool("run_code", {"code": code})
    assert result.is_error is False, result.content
    assert result.structured_content is not None and result.structured_content["n"] == 1
    assert result.structured_content["path"].endswith("/abc")
    texts = [getattr(content, "text", "") for content in result.content]
    assert texts[1] == f"The program printed:\npath {result.structured_content['path']}\n"


async def test_grants_hold_inside_programs(code_stack: CodeStack) -> None:
    """The narrow principal's program has no `get_item`: it fails and nothing reaches the upstream."""
    before = code_stack.upstream.hits_to("/echo/item/narrow")
    async with client_of(code_stack, "auto", NARROW_TOKEN) as client:
        result = await client.call_tool("run_code", {"code": "await tools.get_item(item='narrow')"})
    assert result.is_error is True
    assert "get_item" in text_of(result)
    assert code_stack.upstream.hits_to("/echo/item/narrow") == before


def test_rest_runs_a_program(code_stack: CodeStack) -> None:
    """POST /v1/code: the envelope's result is the value, output the printed text, calls one line per call."""
    code = "import asyncio\nrs = await asyncio.gather(*[tools.get_item(item='r' + str(i)) for i in range(3)])\n"
    code += "print(len(rs))\n[r['path'] for r in rs]"
    answer = httpx2.post(code_stack.gateway.url + "/v1/code", json={"code": code}, headers=auth(FULL_TOKEN), timeout=60)
    assert answer.status_code == 200, answer.text
    envelope = answer.json()
    assert envelope["structuredContent"] == [f"/echo/item/r{i}" for i in range(3)]
    assert envelope["output"] == "3\n"
    assert sorted(line["tool"] for line in envelope["calls"]) == ["get_item"] * 3
    bad = httpx2.post(code_stack.gateway.url + "/v1/code", json={"code": "x = ("}, headers=auth(FULL_TOKEN), timeout=60)
    assert bad.json()["exitCode"] == 65


def test_signatures_of_the_openapi_fixtures_parse(tmp_path: Path) -> None:
    """Every tool of the OpenAPI fixtures (and of a generated 40-operation spec) has a Python signature that
    `ast` parses."""
    entries = []
    for number, spec in enumerate(["petstore.yaml", "swagger.json", "recursive.yaml"]):
        shutil.copy(FIXTURES / "openapi" / spec, tmp_path / spec)
        entries.append(f"  - {{upstream: api{number}, spec: {spec}, base_url: 'http://127.0.0.1:9'}}")
    (tmp_path / "specs-tools.yaml").write_text("openapi:\n" + "\n".join(entries) + "\n")
    generated = tmp_path / "generated"
    generated.mkdir()
    write_spec(generated, 40)
    toolset = file_store.load([tmp_path])
    assert not [p for p in toolset.problems if "error" in str(p).lower()], toolset.problems
    assert len(toolset.tools) >= 50
    for tool in toolset.tools.values():
        tree = ast.parse(signature(tool))
        assert isinstance(tree.body[0], ast.AsyncFunctionDef), tool.name


def test_a_signature_reads_like_python(tmp_path: Path) -> None:
    """Required arguments typed, optional ones defaulting to None, the description as docstring."""
    (tmp_path / "t.yaml").write_text(
        "upstreams: {u: {base_url: 'http://127.0.0.1:9'}}\n"
        "tools:\n"
        "  - name: ticket_lookup\n    upstream: u\n    description: Look a ticket up.\n"
        "    input_schema: {type: object, required: [ticket_id], properties: {ticket_id: {type: string},"
        " limit: {type: integer}, 'page[size]': {type: integer}}}\n"
        "    output_schema: {type: object}\n"
        "    request: {method: GET, path: /t}\n"
    )
    tool = file_store.load([tmp_path]).tools["ticket_lookup"]
    text = signature(tool)
    assert text.startswith(
        "async def ticket_lookup(*, ticket_id: str, limit: int | None = None, **arguments: Any) -> dict:"
    )
    assert "Look a ticket up." in text and "page[size]" in text
    ast.parse(text)


ROOT = Path(__file__).resolve().parent.parent
TASK_CLIENTS = ROOT / "tests" / "support" / "task_clients"
SIDE_ENVS = ROOT / ".venv" / "task-clients"


def task_step(kind: str, stack: CodeStack, action: str, **extra: Any) -> Any:
    """One task step by a new client process of either generation (FastMCP 4: 2026-07-28; mcp 1.x: 2025-11-25)."""
    script = TASK_CLIENTS / ("fastmcp_tasks_client.py" if kind == "fastmcp4" else "mcp_v1_client.py")
    python = SIDE_ENVS / kind / "bin" / "python"
    command = {"url": stack.gateway.url + "/mcp", "token": FULL_TOKEN, "action": action, "timeout": 5, **extra}
    done = subprocess.run([str(python), str(script), json.dumps(command)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["fastmcp4", "mcp1"])
def test_run_code_as_a_task(code_stack: CodeStack, kind: str) -> None:
    """A program started as an MCP task is fetched later by another client, in both generations."""
    subprocess.run(["make", "-s", "task-clients"], cwd=ROOT, check=True, capture_output=True, timeout=900)
    code = "r = await tools.slow_item(delay=2)\nprint('slept')\nr['slow']"
    started = task_step(kind, code_stack, "start", tool="run_code", arguments={"code": code})
    assert "error" not in started, started
    created = started["created"]
    task_id = created["taskId"] if kind == "fastmcp4" else created["task"]["taskId"]
    fetched = task_step(kind, code_stack, "result", tool="run_code", created=created, taskId=task_id)
    assert "result" in fetched, json.dumps(fetched)[:3000]
    result = fetched["result"]
    texts = result["texts"] if kind == "fastmcp4" else [c["text"] for c in result["content"]]
    assert result["isError"] is False, result
    assert texts == ["true", "The program printed:\nslept\n"]


def test_cancelling_a_program_withdraws_its_calls_not_started(code_stack: CodeStack) -> None:
    """DELETE /v1/calls/{callId} of a waiting program: it is answered 75, its calls still queued never run."""
    marker = uuid.uuid4().hex[:8]
    code = f"import asyncio\nawait asyncio.gather(*[tools.slow_item(delay=3, tag='{marker}') for i in range(30)])"
    started = httpx2.post(
        code_stack.gateway.url + "/v1/code", json={"code": code, "waitSeconds": 0}, headers=auth(FULL_TOKEN), timeout=60
    )
    assert started.status_code == 202, started.text
    call_id = started.json()["callId"]
    slow = f"/slow?delay=3&tag={marker}"
    wait_until(lambda: code_stack.upstream.hits_to(slow) > 0, timeout_s=30, what="the first calls")
    cancelled = httpx2.delete(f"{code_stack.gateway.url}/v1/calls/{call_id}", headers=auth(FULL_TOKEN), timeout=30)
    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] is True, cancelled.text
    answer = httpx2.get(
        f"{code_stack.gateway.url}/v1/calls/{call_id}", params={"waitSeconds": 30}, headers=auth(FULL_TOKEN), timeout=60
    ).json()
    assert (answer["exitCode"], answer["error"]["type"]) == (75, "program_cancelled")
    time.sleep(4)  # the calls that had started end; none of the withdrawn ones starts after them
    assert 0 < code_stack.upstream.hits_to(slow) < 30


@pytest.mark.parametrize(("mode", "code_mode", "offered"), [("discovery", "on", True), ("all", "off", False)])
async def test_run_code_beside_the_tools_when_code_mode_is_on(
    code_stack: CodeStack, mode: str, code_mode: str, offered: bool
) -> None:
    """TOOLWORKER_CODE_MODE=on offers run_code in discovery (and all) mode; off, it is no tool there."""
    env = {**code_stack.env, "TOOLWORKER_GATEWAY_MODE": mode, "TOOLWORKER_CODE_MODE": code_mode}
    gateway = start_gateway(env, code_stack.directory / f"gateway-{mode}.log")
    try:
        wait_listening(gateway, ready=True)
        other = CodeStack(gateway, code_stack.upstream, env, code_stack.directory)
        async with client_of(other, "auto") as client:
            names = {tool.name for tool in (await client.list_tools(cursor=None)).tools}
            result = await client.call_tool("run_code", {"code": "6 * 7"}) if offered else None
        rest = httpx2.post(gateway.url + "/v1/code", json={"code": "6 * 7"}, headers=auth(FULL_TOKEN), timeout=60)
    finally:
        gateway.stop()
    assert rest.status_code == (200 if offered else 404), rest.text
    if offered:
        assert "run_code" in names
    if mode == "discovery":
        assert {"list_tools", "search_tools", "get_tool_schema", "call_tool"} <= names
    if result is not None:
        assert result.is_error is False and text_of(result) == "42"


@pytest.mark.parametrize("kind", ["fastmcp4", "mcp1"])
def test_cancelling_a_program_task_withdraws_its_calls(code_stack: CodeStack, kind: str) -> None:
    """tasks/cancel of a program waiting for its calls: the task is cancelled, its calls still queued never run
    (40 calls of 5 s, 8 at a time: most are queued when the cancel comes, a new client process later)."""
    subprocess.run(["make", "-s", "task-clients"], cwd=ROOT, check=True, capture_output=True, timeout=900)
    marker = uuid.uuid4().hex[:8]
    # 5 s calls, longer while the machine is busy: the cancelling client process must start before they end.
    delay = min(round(scaled(5)), 8)  # within the tool's 10 s timeout
    code = f"import asyncio\nawait asyncio.gather(*[tools.slow_item(delay={delay}, tag='{marker}') for i in range(40)])"
    started = task_step(kind, code_stack, "start", tool="run_code", arguments={"code": code})
    created = started["created"]
    task_id = created["taskId"] if kind == "fastmcp4" else created["task"]["taskId"]
    slow = f"/slow?delay={delay}&tag={marker}"
    wait_until(lambda: code_stack.upstream.hits_to(slow) > 0, timeout_s=30, what="the first calls")
    cancelled = task_step(kind, code_stack, "cancel", tool="run_code", created=created, taskId=task_id)
    assert "error" not in cancelled, cancelled
    task = cancelled["status"] if kind == "fastmcp4" else cancelled["task"]
    assert task["status"] == "cancelled", task
    time.sleep(delay + 1)  # the calls that had started end; none of the withdrawn ones starts after them
    assert 0 < code_stack.upstream.hits_to(slow) < 40
