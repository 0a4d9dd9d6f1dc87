"""`toolworker mcp`: the MCP server on standard input and output, for desktop MCP clients.

The same server as `/mcp` (server.py), over one long-lived connection: a handshake-era client is told of a
new definitions version with `notifications/tools/list_changed`. Logs go to standard error; standard
output carries the protocol only. There are no request headers on stdio, so no per-session headers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.stdio import stdio_server

from worker.gateway.calls import open_calls
from worker.gateway.mcp import code_mode
from worker.gateway.mcp.server import McpFront, Options
from worker.settings import Settings


async def _serve(settings: Settings, options: Options) -> None:
    settings = code_mode.settings_for(settings, options.mode)
    async with open_calls(settings, options.tags) as calls:
        front = McpFront.of(calls, settings, options.mode)
        server = front.server()
        init = server.create_initialization_options(NotificationOptions(tools_changed=True))
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, init)


def serve_stdio(settings: Settings, options: Options) -> int:
    asyncio.run(_serve(settings, options))
    return 0


def desktop_config(redis_url: str, definitions: Path) -> str:
    """The `mcpServers` entry a desktop MCP client needs to run `toolworker mcp` on this machine (the gateway
    needs no upstream's URL or secret: those stay with the workers)."""
    env = {"TOOLWORKER_REDIS_URL": redis_url, "TOOLWORKER_DEFINITIONS": str(definitions.resolve())}
    script = Path(sys.executable).with_name("toolworker")
    entry = {"command": str(script), "args": ["mcp"], "env": env}
    return json.dumps({"mcpServers": {"toolworker": entry}}, indent=2)
