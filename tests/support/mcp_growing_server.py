"""An MCP server made with the `mcp` SDK's `MCPServer` whose tool list changes while it runs, run as a process
by the tests: `python -m tests.support.mcp_growing_server PORT [sse]`. `grow(name)` adds a tool `name` (which
answers its own name) and says the list changed: on a `subscriptions/listen` stream (2026-07-28) and on the
session (earlier versions, and the HTTP+SSE transport with `sse`)."""

from __future__ import annotations

import contextlib
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer


def build() -> MCPServer:
    server = MCPServer("growing")

    @server.tool(description="Add a tool named `name` that answers its name, and say the tool list changed.")
    async def grow(name: str, ctx: Context) -> str:
        server.add_tool(lambda: name, name=name, description=f"Answers {name!r}.")
        await ctx.notify_tools_changed()
        with contextlib.suppress(Exception):  # no session-wide notifications at 2026-07-28
            await ctx.session.send_tool_list_changed()
        return f"grew {name}"

    return server


def main() -> None:
    port = int(sys.argv[1])
    server = build()
    app = server.sse_app() if sys.argv[2:] == ["sse"] else server.streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
