"""An MCP server made with the `mcp` SDK's own `MCPServer` (FastMCP's successor), run as a process by the
MCP upstream tests: `python -m tests.support.mcp_upstream_server PORT [DESCRIPTION]`. Its `add` tool's
description is the second argument (a restart with another changes the tool); `calls` counts `add`'s
invocations since start, `cancelled` the waits of `slow` its callers cancelled."""

from __future__ import annotations

import asyncio
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ImageContent
from pydantic import BaseModel

TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


class Sum(BaseModel):
    total: int


def build(description: str) -> MCPServer:
    server = MCPServer("sdk-upstream")
    count = {"add": 0, "cancelled": 0}

    @server.tool(description=description)
    def add(a: int, b: int) -> Sum:
        count["add"] += 1
        return Sum(total=a + b)

    @server.tool(description="A one-pixel PNG.")
    def pixel() -> ImageContent:
        return ImageContent(type="image", data=TINY_PNG, mimeType="image/png")

    @server.tool(description="How many times add was called since the server started.")
    def calls() -> int:
        return count["add"]

    @server.tool(description="Wait `seconds` seconds; a cancelled wait is counted (see `cancelled`).")
    async def slow(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            count["cancelled"] += 1
            raise
        return "done"

    @server.tool(description="How many waits of `slow` were cancelled since the server started.")
    def cancelled() -> int:
        return count["cancelled"]

    _speaking(server)
    return server


def _speaking(server: MCPServer) -> None:
    """Tools that speak to the caller during their call: log messages, progress."""

    @server.tool(description="Log one message at each of debug, info, warning and error, then answer.")
    async def chatty(ctx: Context) -> str:
        for level in ("debug", "info", "warning", "error"):
            await ctx.log(level, f"a {level} message", logger_name="chatty")
        return "said"

    @server.tool(description="Take `steps` steps of `seconds` each, reporting progress after each.")
    async def steps(steps: int, seconds: float, ctx: Context) -> str:
        for step in range(1, steps + 1):
            await asyncio.sleep(seconds)
            await ctx.report_progress(step, steps, f"Step {step} of {steps} done.")
        return f"{steps} steps"


def main() -> None:
    port = int(sys.argv[1])
    description = sys.argv[2] if len(sys.argv) > 2 else "Add two integers."
    app = build(description).streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
