"""MCP servers nobody here wrote, started on loopback by the tests: the reference `server-everything` from
npm (installed by the Makefile into the venv's node folder) and the `mcp` SDK's `MCPServer`
(tests/support/mcp_upstream_server.py), each a process on a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.waiting import wait_until
from worker.dev.embedded import free_port

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
