"""Real processes for the gateway tests: a Redis-compatible server, a worker, a gateway, and a local
upstream that also records the headers it receives (`/seen/...`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
from aiohttp import web
from mcp import Client

from tests.conftest import FIXTURES, SECRET_TOKEN, start_worker, stop_worker, worker_env
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from tests.support.waiting import Budget, scaled
from worker.dev.embedded import EmbeddedRedis, free_port

TOKEN = "gw-token-0123456789"
OTHER_TOKEN = "gw-token-other-42"
DEFINITIONS = FIXTURES / "gateway"
HELD_QUEUE = "gateway-held"
PAGE_SIZE = 4


@dataclass
class Recorder:
    """The upstream's record of the headers each `/seen/...` request carried."""

    seen: list[dict[str, str]] = field(default_factory=list)


def recording_upstream(state: UpstreamState, recorder: Recorder) -> web.Application:
    app = make_upstream(state)

    async def seen(request: web.Request) -> web.Response:
        recorder.seen.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"ok": True})

    app.router.add_get("/seen{tail:.*}", seen)
    return app


@dataclass
class Gateway:
    """A `toolworker gateway` process."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str]
    args: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_worker(self.process)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def restart(self) -> Gateway:
        return start_gateway(self.env, self.log_path, self.port, *self.args)


def gateway_env(redis_url: str, definitions: Path = DEFINITIONS, **extra: str) -> dict[str, str]:
    """The gateway's environment: TOOLWORKER_* only (it needs no upstream's URL or secret)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "TEST_", "OTEL_"))}
    env.update(
        TOOLWORKER_REDIS_URL=redis_url,
        TOOLWORKER_DEFINITIONS=str(definitions),
        TOOLWORKER_GATEWAY_TOKENS=f"{TOKEN},{OTHER_TOKEN}",
        TOOLWORKER_GATEWAY_PAGE_SIZE=str(PAGE_SIZE),
        TOOLWORKER_GATEWAY_CALL_TIMEOUT_SECONDS="20",
    )
    env.update(extra)
    return env


def start_gateway(env: dict[str, str], log_path: Path, port: int | None = None, *args: str) -> Gateway:
    port = port or free_port()
    argv = [sys.executable, "-m", "worker", "gateway", "--port", str(port), *args]
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    gateway = Gateway(process, port, log_path, env, args)
    try:
        wait_listening(gateway)
    except BaseException:  # a gateway that did not come up is not left running
        gateway.stop()
        raise
    return gateway


def wait_listening(gateway: Gateway, timeout_s: float = 60.0, ready: bool = False) -> None:
    """Until the gateway answers HTTP (its /healthz needs no token), and with `ready` until it says a
    worker answers."""
    budget = Budget(timeout_s)
    while True:
        try:
            if httpx2.get(gateway.url + "/healthz", timeout=scaled(5)).status_code == 200 or not ready:
                return
        except httpx2.TransportError:
            pass
        if gateway.process.poll() is not None or budget.exhausted():
            raise RuntimeError(f"the gateway did not start:\n{gateway.log_text()[-3000:]}") from None
        time.sleep(0.05)


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def text_of(result: object) -> str:
    """The one text content of an MCP tool result."""
    content = result.content  # type: ignore[attr-defined]
    assert len(content) == 1 and content[0].type == "text"
    return str(content[0].text)


@dataclass
class Stack:
    redis: EmbeddedRedis
    upstream_state: UpstreamState
    recorder: Recorder
    upstream_url: str
    gateway: Gateway
    worker_env: dict[str, str]
    directory: Path

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="session")
def gateway_stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A Redis of its own, a worker on tests/fixtures/gateway, the recording upstream, a gateway with tokens."""
    directory = tmp_path_factory.mktemp("gateway")
    server = EmbeddedRedis(directory / "redis").start()
    state, recorder = UpstreamState(), Recorder()
    upstream = ServerThread(recording_upstream(state, recorder)).start()
    env = worker_env(server.url, upstream.url, dns_server.address, DEFINITIONS)
    worker = start_worker(env, directory / "worker.log")
    gateway = None
    try:
        gateway = start_gateway(gateway_env(server.url), directory / "gateway.log")
        wait_listening(gateway, ready=True)
        body = {"tool": "echo_get", "arguments": {"item": "warm"}}
        warm = httpx2.post(gateway.url + "/v1/calls", json=body, headers=auth(), timeout=scaled(60))
        assert warm.status_code == 200 and warm.json()["exitCode"] == 0, (warm.text, gateway.log_text()[-2000:])
        yield Stack(server, state, recorder, upstream.url, gateway, env, directory)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


__all__ = ["SECRET_TOKEN", "Gateway", "Stack", "auth", "gateway_stack", "start_gateway", "text_of"]


async def all_tools(client: Client) -> dict[str, object]:
    """Every tool `tools/list` gives, page after page, by name."""
    tools, cursor = {}, None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.update({tool.name: tool for tool in page.tools})
        if (cursor := page.next_cursor) is None:
            return tools
