"""MCP servers nobody here wrote, started on loopback by the tests: the reference `server-everything` from
npm (installed by the Makefile into the venv's node folder) and the `mcp` SDK's `MCPServer`
(tests/support/mcp_upstream_server.py), each a process on a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import start_worker, stop_worker
from tests.support.waiting import wait_until
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = ROOT / ".venv/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"


@dataclass
class McpServerProcess:
    """A server process that can be stopped (or killed) and started again on the same port."""

    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    path: str = "/mcp"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> McpServerProcess:
        env = {**os.environ, **self.env, "PORT": str(self.port)}
        self.process = subprocess.Popen(
            self.argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        wait_until(self._listening, 30, f"the MCP server on port {self.port}")
        return self

    def _listening(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


def everything() -> McpServerProcess:
    """The reference server's Streamable HTTP mode (its port from PORT)."""
    return McpServerProcess(["node", str(EVERYTHING), "streamableHttp"], free_port())


def everything_sse() -> McpServerProcess:
    """The reference server on the 2024-11-05 HTTP+SSE transport (its stream at /sse)."""
    return McpServerProcess(["node", str(EVERYTHING), "sse"], free_port(), path="/sse")


def sdk_server(description: str = "Add two integers.") -> McpServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.mcp_upstream_server", str(port), description]
    return McpServerProcess(argv, port)


def demo_desk() -> McpServerProcess:
    """The MCP server of `make run`'s demo (worker/dev/demo_mcp.py)."""
    port = free_port()
    serve = f"from worker.dev.demo_mcp import serve; serve('127.0.0.1', {port})"
    return McpServerProcess([sys.executable, "-c", serve], port)


@dataclass
class McpStack:
    """A Redis of the tests' own, definitions naming MCP upstreams, and the environment of the processes
    (worker, CLI) that serve them."""

    redis: EmbeddedRedis
    definitions: Path
    env: dict[str, str]
    log_path: Path


def mcp_stack(definitions: Path, tmp_path_factory: Any, upstreams: Iterable[str], **settings: str) -> McpStack:
    """A Redis started, and `upstreams` (of `definitions`) refreshed (listed) through the CLI."""
    redis = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env.update(TOOLWORKER_REDIS_URL=redis.url, TOOLWORKER_DEFINITIONS=str(definitions), TOOLWORKER_METRICS_PORT="0")
    env.update(settings)
    stack = McpStack(redis, definitions, env, tmp_path_factory.mktemp("logs") / "worker.log")
    for name in upstreams:
        refreshed = cli(stack, "upstreams", "refresh", name)
        assert refreshed.returncode == 0, refreshed.stderr
    return stack


def cli(stack: McpStack, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "worker", *args]
    return subprocess.run(argv, env=stack.env, capture_output=True, text=True, timeout=60, check=False)


@contextmanager
def serving_worker(stack: McpStack) -> Iterator[ToolClient]:
    """A worker process on the stack, warmed up by one call of `everything_echo`; a client of it."""
    process = start_worker(stack.env, stack.log_path)
    try:
        with ToolClient(stack.redis.url) as client:
            first = client.call("everything_echo", {"message": "warm-up"}, timeout=90)
            assert first.exit_code == 0, (first.to_dict(), stack.log_path.read_text()[-3000:])
            yield client
    finally:
        stop_worker(process)


class AnsweringCaller:
    """A call's listener (worker/call/relay.py's CallEvents, without Redis) whose caller accepts every question
    with `content`; the questions' messages kept in `asked`."""

    def __init__(self, content: dict[str, Any]) -> None:
        self.content = content
        self.asked: list[str] = []

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        return None

    async def log(self, params: Any) -> None:
        return None

    async def ask(self, method: str, params: Any) -> dict[str, Any]:
        self.asked.append(str(params.get("message")))
        return {"result": {"action": "accept", "content": self.content}}
