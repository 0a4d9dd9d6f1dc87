"""The fault tests' stack: a misbehaving upstream, a raw socket server, and workers on a Redis-compatible
server of their own, with the helpers that enqueue calls and count their envelopes on a reply stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp import web

from tests.conftest import FIXTURES, start_worker, stop_worker, worker_env
from tests.support.servers import DnsServer, ServerThread, TcpServer
from tests.support.waiting import scaled, wait_until
from worker.client import ToolClient
from worker.constants import DEFAULT_QUEUE
from worker.dev.embedded import EmbeddedRedis
from worker.protocol import task_messages
from worker.queue.leases import INFLIGHT_PREFIX

FAULTS = FIXTURES / "faults"


# --- the misbehaving upstream ---------------------------------------------------------------------


@dataclass
class TokenBucket:
    """The upstream's own limit: `rate_per_s` calls a second, bursts of `capacity`."""

    rate_per_s: float
    capacity: float
    tokens: float = 0.0
    updated: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.capacity

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate_per_s)
        self.updated = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class FaultState:
    """What the upstream saw; its handlers run on the server thread, the tests read it."""

    posts: Counter[str] = field(default_factory=Counter)
    gets: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)
    max_in_flight: Counter[str] = field(default_factory=Counter)
    arrivals: dict[str, list[float]] = field(default_factory=dict)
    down: bool = False
    flaky_hits: int = 0
    limiter: TokenBucket = field(default_factory=lambda: TokenBucket(10, 3))
    limited_statuses: Counter[int] = field(default_factory=Counter)


class FaultHandlers:
    """The upstream's endpoints; each one misbehaves in one way."""

    def __init__(self, state: FaultState) -> None:
        self.state = state

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.measure])
        app.router.add_post("/work", self.work)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/concurrency", self.slow)
        app.router.add_get("/outage", self.slow)
        app.router.add_get("/fast/{id}", self.fast)
        app.router.add_get("/slow-body", self.slow_body)
        app.router.add_get("/retry-after/{key}", self.retry_after)
        app.router.add_get("/flaky", self.flaky)
        app.router.add_get("/limited/{id}", self.limited)
        return app

    @web.middleware
    async def measure(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        group = request.path.split("/")[1]
        self.state.in_flight[group] += 1
        self.state.max_in_flight[group] = max(self.state.max_in_flight[group], self.state.in_flight[group])
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            self.state.in_flight[group] -= 1

    async def work(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.state.posts[str(payload["id"])] += 1
        await asyncio.sleep(float(payload["delay"]))
        return web.json_response({"id": payload["id"]})

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("delay", "1")))
        return web.json_response({"slow": True, "id": request.query.get("id")})

    async def fast(self, request: web.Request) -> web.Response:
        self.state.gets[request.match_info["id"]] += 1
        return web.json_response({"id": request.match_info["id"]})

    async def slow_body(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain", "Content-Length": "20"})
        await response.prepare(request)
        await response.write(b"x" * 10)
        await asyncio.sleep(float(request.query.get("delay", "1")))
        with contextlib.suppress(ConnectionError):  # the worker gave up and hung up first, as it should
            await response.write(b"y" * 10)
        return response

    async def retry_after(self, request: web.Request) -> web.Response:
        arrivals = self.state.arrivals.setdefault(request.match_info["key"], [])
        arrivals.append(time.time())
        if len(arrivals) > 1:
            return web.json_response({"ok": True})
        date_form = request.query.get("form") == "date"
        value = formatdate(int(time.time()) + 2, usegmt=True) if date_form else "1"
        return web.Response(status=503, text="busy, come back later", headers={"Retry-After": value})

    async def flaky(self, request: web.Request) -> web.Response:
        self.state.flaky_hits += 1
        if self.state.down:
            return web.Response(status=503, text="down")
        return web.json_response({"up": True})

    async def limited(self, request: web.Request) -> web.Response:
        if self.state.limiter.take():
            self.state.limited_statuses[200] += 1
            return web.json_response({"id": request.match_info["id"]})
        self.state.limited_statuses[429] += 1
        return web.Response(status=429, text="slow down", headers={"Retry-After": "1"})


class RawServer(TcpServer):
    """A bare TCP server for what aiohttp's server will not do: hang up without answering, reset mid-body."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        path = head.split(b" ", 2)[1].decode()
        self.paths.append(path)
        if path.startswith("/reset-mid-body"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
            await writer.drain()
            # Linger 0: closing sends a TCP RST instead of a FIN.
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        writer.close()
        await writer.wait_closed()


@dataclass
class FaultUpstream:
    url: str
    state: FaultState


@pytest.fixture(scope="module")
def fault_upstream() -> Iterator[FaultUpstream]:
    """The misbehaving upstream, counting requests per kind and in flight."""
    state = FaultState()
    server = ServerThread(FaultHandlers(state).app()).start()
    yield FaultUpstream(server.url, state)
    server.stop()


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[RawServer]:
    """A raw socket server (the stack's environment names it)."""
    server = RawServer().start()
    yield server
    server.stop()


# --- workers and helpers -------------------------------------------------------------------------


@dataclass
class Stack:
    """A Redis-compatible server and the environment its workers run with."""

    server: EmbeddedRedis
    env: dict[str, str]
    logs: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_worker(self) -> subprocess.Popen[bytes]:
        process = start_worker(self.env, self.logs / f"worker-{len(self.workers)}.log")
        self.workers.append(process)
        return process

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.server.url)

    def log_tail(self, chars: int = 4000) -> str:
        return "\n".join(p.read_text(errors="replace")[-chars:] for p in sorted(self.logs.glob("worker-*.log")))

    def close(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                stop_worker(process)
        self.server.stop()


def make_stack(
    directory: Path, definitions: Path, upstream_url: str, dns: DnsServer, raw_url: str, persistent: bool = False
) -> Stack:
    server = EmbeddedRedis(directory / "redis", persistent=persistent).start()
    env = worker_env(server.url, upstream_url, dns.address, definitions)
    env.update(TEST_RAW_URL=raw_url)  # every other setting at its default
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return Stack(server, env, logs)


def warm_up(stack: Stack, tool: str, arguments: dict[str, Any]) -> None:
    """Wait (bounded) until a worker answers; any envelope will do."""
    with ToolClient(stack.server.url) as tool_client:
        result = tool_client.call(tool, arguments, timeout=scaled(60))
    assert result.error is None or result.error["type"] != "timeout", stack.log_tail()


def serving(stack: Stack, tool: str = "fast_get", arguments: dict[str, Any] | None = None) -> Iterator[Stack]:
    """A module's shared stack: one worker, answering before the first test, stopped after the last."""
    try:
        stack.start_worker()
        warm_up(stack, tool, {"id": "warm-up"} if arguments is None else arguments)
        yield stack
    finally:
        stack.close()


def make_call(tool: str, arguments: dict[str, Any], stream: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = (datetime.now(UTC) + timedelta(seconds=timeout_s)).isoformat()
    call_id = str(uuid.uuid4())
    return {
        "callId": call_id,
        "tool": tool,
        "arguments": arguments,
        "timeoutSeconds": timeout_s,
        "deadline": deadline,
        "replyTo": stream,
    }


def enqueue(client: redis.Redis, calls: list[dict[str, Any]], batch: int) -> None:
    """LPUSH the calls as Celery messages of `batch` calls each, as a producer in any language would."""
    messages = task_messages(calls, DEFAULT_QUEUE, batch)
    for start in range(0, len(messages), 500):
        client.lpush(DEFAULT_QUEUE, *messages[start : start + 500])


def stream_envelopes(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    """Every envelope on the stream, oldest first."""
    envelopes: list[dict[str, Any]] = []
    after = "-"
    while True:
        entries: Any = client.xrange(stream, min=after, count=5000)
        if not entries:
            return envelopes
        envelopes.extend(json.loads(data[b"envelope"]) for _, data in entries)
        after = "(" + entries[-1][0].decode()  # exclusive: the next page starts after the last entry


def wait_for_envelopes(client: redis.Redis, stream: str, count: int, timeout_s: float) -> float:
    """Wait until `count` envelopes are on the stream; return how long it took."""
    started = time.monotonic()
    wait_until(lambda: client.xlen(stream) >= count, timeout_s, f"{count} envelopes on {stream}")
    return time.monotonic() - started


def per_call(envelopes: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(e["callId"]) for e in envelopes)


def report(name: str, **figures: Any) -> None:
    print(f"\n[faults] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def holdings(client: redis.Redis) -> Counter[int]:
    """Messages held now, by the pid of the worker process holding them."""
    held: Counter[int] = Counter()
    for key in client.scan_iter(match=INFLIGHT_PREFIX + "*"):
        held[int(key.decode()[len(INFLIGHT_PREFIX) :].split(":")[1])] += int(client.llen(key))
    return held
