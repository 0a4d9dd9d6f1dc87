"""Code mode: what a model reads for one task, how long a program's calls take, and what a program costs.

1. One fixed task on a 465-tool catalog shaped like PagerDuty's (five PagerDuty tools — services,
   incidents, manage an incident — among 460 generated OpenAPI operations; no PagerDuty spec ships with the
   repository): find the `checkout` service, list its open incidents, acknowledge the newest. A scripted
   model drives the real gateway over MCP (the SDK's `Client`) in `all`, `discovery` and `code` modes; the
   figure is the bytes of tool listings, schemas and results it reads across the conversation, every turn
   re-reading what came before (as a chat model does). Target: code mode at most 5% of `all`.
2. A program making 20 independent calls with `asyncio.gather` (100 ms upstream) against 20 sequential MCP
   `tools/call`s from one client, through the same gateway and worker. Target: at most 15%.
3. A program with no tool call (p50 wall time, and worker CPU per program: the worker's process tree,
   sandbox included), and one resumption (a program making one call, less a program making none).

    .venv/bin/python -m benchmarks.code_mode [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx2
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from benchmarks.harness.figures import Target
from benchmarks.harness.meter import cpu_s
from benchmarks.harness.processes import gateway, process_group
from tests.support.openapi_gen import generate_spec
from worker.client import AsyncToolClient
from worker.dev.embedded import EmbeddedRedis, free_port

GENERATED_OPERATIONS = 460
GATHERED_CALLS = 20
UPSTREAM_DELAY_S = 0.1
PAGERDUTY = """
upstreams:
  pagerduty:
    base_url: ${env:BENCH_UPSTREAM_URL}
tools:
  - name: list_services
    upstream: pagerduty
    description: List existing services, optionally filtered by a query on their name.
    tags: [services]
    input_schema: {type: object, properties: {query: {type: string, description: Filters by name.}}}
    request: {method: GET, path: /services, query: {query: "${query}"}}
  - name: get_service
    upstream: pagerduty
    description: Get details about an existing service.
    tags: [services]
    input_schema: {type: object, required: [id], properties: {id: {type: string}}}
    request: {method: GET, path: "/services/${id}"}
  - name: list_incidents
    upstream: pagerduty
    description: List incidents, filtered by service and status (triggered, acknowledged, resolved).
    tags: [incidents]
    input_schema:
      type: object
      properties:
        service_id: {type: string, description: Only incidents of this service.}
        statuses: {type: string, description: "A status: triggered, acknowledged or resolved."}
    request: {method: GET, path: /incidents, query: {service_id: "${service_id}", statuses: "${statuses}"}}
  - name: get_incident
    upstream: pagerduty
    description: Show detailed information about an incident.
    tags: [incidents]
    input_schema: {type: object, required: [id], properties: {id: {type: string}}}
    request: {method: GET, path: "/incidents/${id}"}
  - name: manage_incident
    upstream: pagerduty
    description: Acknowledge, resolve or reassign an incident.
    tags: [incidents]
    input_schema:
      type: object
      required: [id, status]
      properties: {id: {type: string}, status: {type: string, enum: [acknowledged, resolved]}}
    request: {method: PUT, path: "/incidents/${id}", body: {incident: {type: incident_reference, status: "${status}"}}}
  - name: slow_echo
    upstream: pagerduty
    description: Answers after 100 ms (the wall-time rows).
    input_schema: {type: object, properties: {i: {type: integer}}}
    request: {method: GET, path: /slow, query: {i: "${i}"}}
"""
NO_CALL = "x = 6 * 7\nx"
ONE_CALL = "(await tools.get_service(id='a'))['service']['id']"
PROGRAM = """
services = await tools.list_services(query="checkout")
service = services["services"][0]
open_now = await tools.list_incidents(service_id=service["id"], statuses="triggered")
newest = max(open_now["incidents"], key=lambda i: i["created_at"])
done = await tools.manage_incident(id=newest["id"], status="acknowledged")
{"service": service["id"], "acknowledged": newest["id"], "status": done["incident"]["status"]}
"""


def _service(n: int) -> dict[str, Any]:
    name = "checkout" if n == 0 else f"service-{n}"
    return {
        "id": f"PSV{n:04d}",
        "type": "service",
        "name": name,
        "description": f"The {name} service, paged through its escalation policy.",
        "status": "active",
        "escalation_policy": {"id": f"PEP{n:04d}", "type": "escalation_policy_reference", "summary": "On call"},
        "teams": [{"id": "PTEAM01", "type": "team_reference", "summary": "Payments"}],
        "html_url": f"https://example.pagerduty.com/service-directory/PSV{n:04d}",
        "created_at": "2026-01-01T00:00:00Z",
    }


def _incident(n: int) -> dict[str, Any]:
    return {
        "id": f"PIN{n:04d}",
        "type": "incident",
        "incident_number": 1000 + n,
        "title": f"Checkout latency above threshold ({n})",
        "status": "triggered",
        "urgency": "high",
        "created_at": f"2026-11-{1 + n % 27:02d}T{n % 24:02d}:00:00Z",
        "service": {"id": "PSV0000", "type": "service_reference", "summary": "checkout"},
        "assignments": [{"assignee": {"id": "PUSER1", "type": "user_reference", "summary": "Ada"}}],
        "html_url": f"https://example.pagerduty.com/incidents/PIN{n:04d}",
    }


def pagerduty_app() -> web.Application:
    """A local stand-in for PagerDuty's REST API: ten services, twelve open incidents, a 100 ms endpoint."""

    async def services(request: web.Request) -> web.Response:
        query = request.query.get("query", "")
        rows = [s for s in (_service(n) for n in range(10)) if query in s["name"]]
        return web.json_response({"services": rows, "limit": 25, "offset": 0, "more": False})

    async def incidents(request: web.Request) -> web.Response:
        return web.json_response({"incidents": [_incident(n) for n in range(12)], "more": False})

    async def manage(request: web.Request) -> web.Response:
        body = await request.json()
        incident = {**_incident(int(request.match_info["id"][3:])), "status": body["incident"]["status"]}
        return web.json_response({"incident": incident})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(UPSTREAM_DELAY_S)
        return web.json_response({"i": request.query.get("i")})

    app = web.Application()
    app.router.add_get("/services", services)
    app.router.add_get("/services/{id}", lambda r: web.json_response({"service": _service(0)}))
    app.router.add_get("/incidents", incidents)
    app.router.add_get("/incidents/{id}", lambda r: web.json_response({"incident": _incident(0)}))
    app.router.add_put("/incidents/{id}", manage)
    app.router.add_get("/slow", slow)
    return app


def write_catalog(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pagerduty.yaml").write_text(PAGERDUTY)
    (directory / "generated.json").write_text(json.dumps(generate_spec(GENERATED_OPERATIONS)))
    entry = '  - {upstream: generated, spec: generated.json, base_url: "${env:BENCH_UPSTREAM_URL}"}\n'
    (directory / "generated-tools.yaml").write_text("openapi:\n" + entry)
    return directory


@asynccontextmanager
async def mcp_client(url: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(timeout=120) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http), mode="auto") as client,
    ):
        yield client


def _bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode())


def _result_bytes(result: Any) -> int:
    """What the model reads of a tool result: its content blocks and its structured content."""
    return _bytes(
        result.model_dump(mode="json", by_alias=True, exclude_none=True, include={"content", "structured_content"})
    )


async def _listing(client: Client) -> int:
    total, cursor = 0, None
    while True:
        page = await client.list_tools(cursor=cursor)
        total += _bytes([tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in page.tools])
        if not page.next_cursor:
            return total
        cursor = page.next_cursor


async def _call(client: Client, name: str, arguments: dict[str, Any]) -> tuple[int, Any]:
    result = await client.call_tool(name, arguments)
    if result.is_error:
        raise RuntimeError(f"{name} failed: {result.content}")
    return _result_bytes(result), result.structured_content


def conversation(reads: list[int]) -> int:
    """Bytes read over a conversation whose turn k re-reads the first k pieces (listing, then each answer)."""
    return sum(sum(reads[: k + 1]) for k in range(len(reads)))


async def task_in_all_mode(url: str) -> list[int]:
    async with mcp_client(url) as client:
        reads = [await _listing(client)]
        size, services = await _call(client, "list_services", {"query": "checkout"})
        reads.append(size)
        service_id = services["services"][0]["id"]
        size, found = await _call(client, "list_incidents", {"service_id": service_id, "statuses": "triggered"})
        reads.append(size)
        newest = max(found["incidents"], key=lambda i: i["created_at"])
        reads.append((await _call(client, "manage_incident", {"id": newest["id"], "status": "acknowledged"}))[0])
    return reads


async def task_in_discovery_mode(url: str) -> list[int]:
    async with mcp_client(url) as client:
        reads = [await _listing(client)]
        reads.append((await _call(client, "search_tools", {"question": "pagerduty incidents of a service"}))[0])
        names = ["list_services", "list_incidents", "manage_incident"]
        reads.append((await _call(client, "get_tool_schema", {"names": names}))[0])

        async def via(name: str, arguments: dict[str, Any]) -> Any:
            size, value = await _call(client, "call_tool", {"name": name, "arguments": arguments})
            reads.append(size)
            return value

        services = await via("list_services", {"query": "checkout"})
        args = {"service_id": services["services"][0]["id"], "statuses": "triggered"}
        found = await via("list_incidents", args)
        newest = max(found["incidents"], key=lambda i: i["created_at"])
        await via("manage_incident", {"id": newest["id"], "status": "acknowledged"})
    return reads


async def task_in_code_mode(url: str) -> list[int]:
    async with mcp_client(url) as client:
        reads = [await _listing(client)]
        reads.append((await _call(client, "search_tools", {"question": "pagerduty incidents of a service"}))[0])
        names = ["list_services", "list_incidents", "manage_incident"]
        reads.append((await _call(client, "get_tool_schema", {"names": names}))[0])
        size, value = await _call(client, "run_code", {"code": PROGRAM})
        if value is None or value.get("status") != "acknowledged":
            raise RuntimeError(f"the program did not acknowledge: {value}")
        reads.append(size)
    return reads


async def gathered_against_sequential(url: str, rounds: int) -> dict[str, float]:
    """The median of `rounds` of each: 20 sequential tools/call, and one program gathering 20 calls."""
    code = (
        f"import asyncio\nrs = await asyncio.gather(*[tools.slow_echo(i=i) for i in range({GATHERED_CALLS})])\nlen(rs)"
    )
    sequential, gathered = [], []
    async with mcp_client(url) as client:
        await _call(client, "slow_echo", {"i": -1})
        for _ in range(rounds):
            started = time.perf_counter()
            for i in range(GATHERED_CALLS):
                await _call(client, "slow_echo", {"i": i})
            sequential.append(time.perf_counter() - started)
            started = time.perf_counter()
            await _call(client, "run_code", {"code": code})
            gathered.append(time.perf_counter() - started)
    seq_s, gat_s = statistics.median(sequential), statistics.median(gathered)
    return {"sequential_s": round(seq_s, 3), "gathered_s": round(gat_s, 3), "ratio": round(gat_s / seq_s, 3)}


async def program_costs(redis_url: str, worker_pid: int, programs: int) -> dict[str, float]:
    """p50 wall time and worker CPU (its process tree) per program without a call and with one call."""
    rows: dict[str, float] = {}
    async with AsyncToolClient(redis_url) as client:
        for label, code in (
            ("no_call", "x = 6 * 7\nx"),
            ("one_call", "(await tools.get_service(id='a'))['service']['id']"),
        ):
            await client.arun_code(code)
            times, cpu_before = [], cpu_s(worker_pid)
            for _ in range(programs):
                started = time.perf_counter()
                answer = await client.arun_code(code)
                times.append(time.perf_counter() - started)
                if answer.exit_code:
                    raise RuntimeError(f"the program failed: {answer.error}")
            rows[f"{label}_p50_ms"] = round(statistics.median(times) * 1000, 2)
            rows[f"{label}_cpu_ms"] = round((cpu_s(worker_pid) - cpu_before) * 1000 / programs, 2)
    rows["resumption_p50_ms"] = round(rows["one_call_p50_ms"] - rows["no_call_p50_ms"], 2)
    rows["resumption_cpu_ms"] = round(rows["one_call_cpu_ms"] - rows["no_call_cpu_ms"], 2)
    return rows


@contextmanager
def fleet(redis_url: str, upstream_url: str, definitions: Path) -> Iterator[int]:
    """One worker on the catalog; yields its pid once it answers a program."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
    env |= {
        "TOOLWORKER_REDIS_URL": redis_url,
        "TOOLWORKER_DEFINITIONS": str(definitions),
        "TOOLWORKER_LOG_LEVEL": "WARNING",
        "BENCH_UPSTREAM_URL": upstream_url,
    }
    argv = [sys.executable, "-m", "worker", "worker", "--loglevel", "WARNING"]
    with tempfile.TemporaryDirectory() as tmp, process_group(argv, env, Path(tmp) / "worker.log") as pid:
        asyncio.run(_warm(redis_url))
        yield pid


async def _warm(redis_url: str) -> None:
    async with AsyncToolClient(redis_url) as client:
        answer = await client.arun_code("(await tools.get_service(id='warm'))['service']['id']", timeout=120)
    if answer.exit_code:
        raise RuntimeError(f"the worker did not run a program: {answer.error}")


async def _serve_upstream(port: int) -> web.AppRunner:
    runner = web.AppRunner(pagerduty_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def run(redis_url: str, quick: bool) -> dict[str, Any]:
    """Every row of this section, with the two targets."""
    port = free_port()
    upstream_url = f"http://127.0.0.1:{port}"
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(_serve_upstream(port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            definitions = write_catalog(Path(tmp) / "catalog")
            with fleet(redis_url, upstream_url, definitions) as worker_pid:
                return _measured(redis_url, definitions, worker_pid, quick)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _measured(redis_url: str, definitions: Path, worker_pid: int, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"tools": GENERATED_OPERATIONS + 6}
    reads: dict[str, list[int]] = {}
    for mode, task in (("all", task_in_all_mode), ("discovery", task_in_discovery_mode), ("code", task_in_code_mode)):
        with gateway(redis_url, definitions, TOOLWORKER_GATEWAY_MODE=mode) as (url, _):
            reads[mode] = asyncio.run(task(url))
    results["model_reads"] = {mode: {"pieces": r, "conversation_bytes": conversation(r)} for mode, r in reads.items()}
    all_bytes = results["model_reads"]["all"]["conversation_bytes"]
    results["code_share_of_all"] = round(results["model_reads"]["code"]["conversation_bytes"] / all_bytes, 4)
    # One page holds the catalog: the SDK client validates each answer against the listed tool, listing again
    # whenever it has not seen it.
    with gateway(redis_url, definitions, TOOLWORKER_CODE_MODE="on", TOOLWORKER_GATEWAY_PAGE_SIZE="1000") as (url, _):
        results["gather"] = asyncio.run(gathered_against_sequential(url, 1 if quick else 3))
    results["costs"] = asyncio.run(program_costs(redis_url, worker_pid, 20 if quick else 100))
    return results


def targets(results: dict[str, Any]) -> list[Target]:
    share, ratio = results["code_share_of_all"], results["gather"]["ratio"]
    return [
        Target("code mode reads <= 5% of all mode", f"{share:.1%}", share <= 0.05),
        Target("20 gathered calls <= 15% of 20 sequential", f"{ratio:.1%}", ratio <= 0.15),
    ]


def print_section(results: dict[str, Any]) -> None:
    print(f"\ncode mode ({results['tools']} tools; the task: find a service, its open incidents, ack the newest)")
    for mode, row in results["model_reads"].items():
        pieces = " + ".join(str(p) for p in row["pieces"])
        print(f"  {mode:<9} reads {row['conversation_bytes']:>9} bytes over the conversation  (pieces {pieces})")
    gather = results["gather"]
    print(f"  20 sequential tools/call {gather['sequential_s']} s; one program gathering 20: {gather['gathered_s']} s")
    costs = results["costs"]
    print(f"  program without calls: p50 {costs['no_call_p50_ms']} ms, worker CPU {costs['no_call_cpu_ms']} ms")
    print(f"  one resumption adds: p50 {costs['resumption_p50_ms']} ms, worker CPU {costs['resumption_cpu_ms']} ms")
    for target in targets(results):
        print(f"  target {target.name}: {target.shown} {'met' if target.met else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            results = run(server.url, args.quick)
        finally:
            server.stop()
    print_section(results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
