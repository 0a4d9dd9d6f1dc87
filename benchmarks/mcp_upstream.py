"""An MCP upstream's tool through the fleet, against a direct `mcp` SDK client session to the same server.

One MCP server (the SDK's own `MCPServer`, a 0 ms `echo` tool; `python -m benchmarks.mcp_upstream PORT`
runs it; `python -m benchmarks.mcp_upstream --profile DIR` samples the worker with py-spy while the tool
is called through it) that counts the handshakes it answers (`initialize`, `server/discover`), one worker process
serving that server's tools and an HTTP tool on the 0 ms benchmark upstream. Each round, at the same
concurrency:

- direct: one SDK `Client` session calling `echo` from this process (`client.session.call_tool`, as the
  workers send it);
- fleet: `AsyncToolClient` calls of `bench_echo` through the worker: calls/s, the server's handshakes per
  call (the worker keeps one session, so after its warm-up: 0) and the worker's CPU per call;
- fleet, HTTP: the same number of calls of the HTTP tool, for the worker's CPU per HTTP call;
- the SDK's client alone, built as a worker builds its session (its transport, uvloop), in this process: its
  CPU per call, the least an MCP call can cost a worker that sends with the SDK.

Targets: the fleet at least 80% of the direct client's calls/s; worker CPU per MCP call at most 3x an HTTP
call's. The medians of the rounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvloop

from benchmarks.harness import processes, profiling
from benchmarks.harness.constants import CALL_TIMEOUT_S, RAW_CONCURRENCY, START_TIMEOUT_S, TOOL
from benchmarks.harness.figures import Target
from benchmarks.harness.meter import Meter
from worker.client import AsyncToolClient
from worker.dev.embedded import free_port

CONCURRENCY = 32
MCP_TOOL = "bench_echo"
HTTP_TOOL = TOOL
MIN_SHARE = 0.80
MAX_CPU_RATIO = 3.0
HANDSHAKE_METHODS = frozenset({"initialize", "server/discover"})


# --- the server ----------------------------------------------------------------------------------


def serve(port: int) -> None:
    """The benchmark's MCP server: `echo`, and `/handshakes` (how many it answered)."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from starlette.types import Receive, Scope, Send

    server = MCPServer("bench")
    counted = {"handshakes": 0}

    @server.tool(description="Answer the text.")
    def echo(text: str) -> str:
        return text

    mcp_app = server.streamable_http_app()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/handshakes":
            body = json.dumps(counted).encode()
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        await mcp_app(scope, _counting(receive, counted), send)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


def _counting(receive: Any, counted: dict[str, int]) -> Any:
    """The request's body passed on, its JSON-RPC handshakes counted."""

    async def wrapped() -> Any:
        message = await receive()
        body = message.get("body") or b""
        if b'"method"' in body:
            try:
                method = json.loads(body).get("method")
            except ValueError:
                method = None
            if method in HANDSHAKE_METHODS:
                counted["handshakes"] += 1
        return message

    return wrapped


def handshakes(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{url}/handshakes", timeout=10) as resp:
        return int(json.load(resp)["handshakes"])


@contextmanager
def mcp_server() -> Iterator[str]:
    port = free_port()
    with processes.process_group([sys.executable, "-m", "benchmarks.mcp_upstream", str(port)], dict(os.environ)):
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                handshakes(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the benchmark MCP server did not start") from None
                time.sleep(0.05)
        yield url


# --- the worker ----------------------------------------------------------------------------------


def _definitions(directory: Path, mcp_url: str) -> Path:
    processes.definitions(directory, RAW_CONCURRENCY)
    (directory / "mcp.yaml").write_text(
        f"upstreams:\n  bench_mcp:\n    mcp: {{url: '{mcp_url}/mcp', prefix: bench_}}\n"
    )
    return directory


@contextmanager
def worker(redis_url: str, upstream_url: str, mcp_url: str) -> Iterator[int]:
    """One worker process serving both tools, the MCP upstream listed before it starts."""
    from worker.definitions import file_store
    from worker.settings import Settings
    from worker.upstreams.operate import Operator

    with tempfile.TemporaryDirectory() as tmp:
        folder = _definitions(Path(tmp) / "definitions", mcp_url)
        settings = Settings(redis_url=redis_url, definitions=folder)
        asyncio.run(Operator(settings).refresh(file_store.load([folder]), "bench_mcp"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
        env |= {
            "TOOLWORKER_REDIS_URL": redis_url,
            "TOOLWORKER_DEFINITIONS": str(folder),
            "TOOLWORKER_LOG_LEVEL": "WARNING",
            "BENCH_UPSTREAM_URL": upstream_url,
        }
        argv = [sys.executable, "-m", "worker", "worker", "-P", "threads", "-c", "64", "--loglevel", "WARNING"]
        with processes.process_group(argv, env, Path(tmp) / "worker.log") as pid:
            asyncio.run(_fleet(redis_url, MCP_TOOL, {"text": "warm"}, 1, 1))
            yield pid


# --- the measurements ----------------------------------------------------------------------------


async def _limited(calls: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> float:
    """Seconds for `calls` calls of `one`, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> None:
        async with gate:
            await one(i)

    started = time.perf_counter()
    await asyncio.gather(*(limited(i) for i in range(calls)))
    return time.perf_counter() - started


async def _direct(mcp_url: str, calls: int, concurrency: int) -> float:
    from mcp import Client
    from mcp.types import CallToolResult

    async with Client(f"{mcp_url}/mcp", cache=None) as client:
        await client.call_tool("echo", {"text": "warm"})

        async def one(i: int) -> None:  # on the session, as the workers send (the cheaper of the SDK's two ways)
            result = await client.session.call_tool("echo", {"text": str(i)})
            if not isinstance(result, CallToolResult) or result.is_error:
                raise RuntimeError(f"the direct call failed: {result.content}")

        return await _limited(calls, concurrency, one)


async def _sdk_alone(mcp_url: str, calls: int, concurrency: int) -> float:
    """The `mcp` SDK's client alone, built as a worker builds its session (its httpx client sent with aiohttp,
    on uvloop), calling `echo` as the workers do: this process's CPU seconds for `calls` calls. What an MCP call
    costs a worker can be no less."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from worker.mcp_client.connections import http_client

    async with (
        http_client({}, httpx2.Timeout(CALL_TIMEOUT_S), httpx2.Auth()) as http,
        Client(streamable_http_client(f"{mcp_url}/mcp", http_client=http), cache=None) as client,
    ):
        await client.session.call_tool("echo", {"text": "warm"})

        async def one(i: int) -> None:
            await client.session.call_tool("echo", {"text": str(i)})

        started = time.process_time()
        await _limited(calls, concurrency, one)
        return time.process_time() - started


async def _fleet(redis_url: str, tool: str, arguments: dict[str, Any], calls: int, concurrency: int) -> float:
    async with AsyncToolClient(redis_url) as client:

        async def one(i: int) -> None:
            result = await client.acall(tool, {**arguments}, timeout=CALL_TIMEOUT_S)
            if result.exit_code:
                raise RuntimeError(f"{tool} failed: {result.error}")

        return await _limited(calls, concurrency, one)


def _round(redis_url: str, mcp_url: str, pid: int, calls: int) -> dict[str, float]:
    direct_s = asyncio.run(_direct(mcp_url, calls, CONCURRENCY))
    before = handshakes(mcp_url)
    with Meter(pid) as mcp_meter:
        fleet_s = asyncio.run(_fleet(redis_url, MCP_TOOL, {"text": "x"}, calls, CONCURRENCY))
    fleet_handshakes = handshakes(mcp_url) - before
    with Meter(pid) as http_meter:
        asyncio.run(_fleet(redis_url, HTTP_TOOL, {"i": 1}, calls, CONCURRENCY))
    sdk_cpu_s = uvloop.run(_sdk_alone(mcp_url, calls, CONCURRENCY))
    return {
        "direct_calls_per_s": calls / direct_s,
        "fleet_calls_per_s": calls / fleet_s,
        "handshakes_per_call": fleet_handshakes / calls,
        "worker_cpu_ms_per_mcp_call": mcp_meter.cpu_s * 1000 / calls,
        "worker_cpu_ms_per_http_call": http_meter.cpu_s * 1000 / calls,
        "sdk_client_cpu_ms_per_call": sdk_cpu_s * 1000 / calls,
    }


def run(redis_url: str, calls: int, rounds: int) -> dict[str, Any]:
    """Each round: direct, fleet (MCP), fleet (HTTP); the medians."""
    measured: list[dict[str, float]] = []
    with (
        processes.upstream(0.0, 1024) as upstream,
        mcp_server() as mcp_url,
        worker(redis_url, upstream.url, mcp_url) as pid,
    ):
        for _ in range(rounds):
            figures = _round(redis_url, mcp_url, pid, calls)
            measured.append(figures)
            print(
                f"  mcp: {figures['fleet_calls_per_s']:.0f} vs {figures['direct_calls_per_s']:.0f} calls/s",
                file=sys.stderr,
            )
    medians = {key: statistics.median(m[key] for m in measured) for key in measured[0]}
    return {"calls": calls, "rounds": rounds, "concurrency": CONCURRENCY, **medians}


def targets(results: dict[str, Any]) -> list[Target]:
    share = results["fleet_calls_per_s"] / results["direct_calls_per_s"]
    cpu_ratio = results["worker_cpu_ms_per_mcp_call"] / results["worker_cpu_ms_per_http_call"]
    handshakes_per_call = results["handshakes_per_call"]
    return [
        Target(f"MCP upstream through the fleet >= {MIN_SHARE:.0%} of a direct SDK session's calls/s",
               f"{share:.0%}", share >= MIN_SHARE),
        Target("MCP handshakes per call after warm-up = 0", f"{handshakes_per_call:.3f}", handshakes_per_call == 0),
        Target(f"worker CPU per MCP call <= {MAX_CPU_RATIO:g}x an HTTP call's", f"{cpu_ratio:.2f}x",
               cpu_ratio <= MAX_CPU_RATIO),
    ]  # fmt: skip


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\nMCP upstream: {results['calls']} calls, {results['concurrency']} at a time, 0 ms tool; "
        f"medians of {results['rounds']} rounds"
    )
    print(f"  direct SDK session:  {results['direct_calls_per_s']:>8.0f} calls/s")
    print(f"  through the fleet:   {results['fleet_calls_per_s']:>8.0f} calls/s")
    print(f"  handshakes per call: {results['handshakes_per_call']:.3f}")
    print(
        f"  worker CPU per call: MCP {results['worker_cpu_ms_per_mcp_call']:.3f} ms, "
        f"HTTP {results['worker_cpu_ms_per_http_call']:.3f} ms"
    )
    sdk_ms = results["sdk_client_cpu_ms_per_call"]
    print(
        f"  the SDK's client alone, as a worker builds it: {sdk_ms:.3f} ms of CPU per call, "
        f"{sdk_ms / results['worker_cpu_ms_per_http_call']:.2f}x an HTTP call's worker CPU (a floor for MCP's)"
    )
    for target in targets(results):
        print(f"  [{'met' if target.met else 'MISSED':>6}] {target.name}: {target.shown}")


def profile(directory: Path) -> None:
    """py-spy on the worker while MCP calls run, CONCURRENCY at a time; the top entries printed."""
    with (
        processes.embedded_redis() as server,
        processes.upstream(0.0, 1024) as upstream,
        mcp_server() as mcp_url,
        worker(server.url, upstream.url, mcp_url) as pid,
    ):

        def keep_busy(done: threading.Event) -> None:
            while not done.is_set():
                asyncio.run(_fleet(server.url, MCP_TOOL, {"text": "x"}, 500, CONCURRENCY))

        print(profiling.profile(pid, "worker-mcp", directory, keep_busy))


if __name__ == "__main__":  # PORT: the server; --profile DIR: the worker's profile
    if sys.argv[1] == "--profile":
        profile(Path(sys.argv[2]))
    else:
        serve(int(sys.argv[1]))
