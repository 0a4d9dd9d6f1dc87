"""A FastMCP 4 server with background tasks (the SEP-2663 `io.modelcontextprotocol/tasks` extension), run as a
process by the upstream task tests with FastMCP's own Python (.venv/task-clients/fastmcp4):
`python tests/support/fastmcp_upstream.py PORT LEDGER`. Never imported by the tests.

Every start and every end of a task's body is a line appended to the file LEDGER (`start brew`, `cancelled
brew`, `done brew`), so a test counts how many times the server ran a tool, and whether its task was
cancelled, across processes and restarts of the caller.

- `brew(seconds)`: task `required`; reports progress with a message while it waits, then answers text;
- `chart()`: task `required`; answers an image block and structuredContent under an outputSchema;
- `spill()`: task `required`; fails (its task ends `failed`);
- `nap(seconds)`: task `optional` (a task only when the caller asks for one), answers text.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.types import ImageContent, TextContent

TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def build(ledger: Path) -> FastMCP:
    server = FastMCP("fastmcp-upstream")
    server.add_extension(TasksExtension(url="memory://"))

    def note(line: str) -> None:
        with ledger.open("a") as out:
            out.write(line + "\n")

    async def waited(name: str, seconds: float, ctx: Context) -> None:
        note(f"start {name}")
        try:
            steps = max(1, int(seconds * 4))
            for step in range(steps):
                await ctx.report_progress(step, steps, f"{name}: step {step + 1} of {steps}")
                await asyncio.sleep(seconds / steps)
        except asyncio.CancelledError:
            note(f"cancelled {name}")
            raise
        note(f"done {name}")

    @server.tool(task=TaskConfig(mode="required"), description="Brew for `seconds` seconds, as a task.")
    async def brew(seconds: float, ctx: Context) -> str:
        await waited("brew", seconds, ctx)
        return f"brewed for {seconds} s"

    @server.tool(
        task=TaskConfig(mode="required"),
        description="A chart: one image and its numbers.",
        output_schema={
            "type": "object",
            "properties": {"points": {"type": "integer"}, "title": {"type": "string"}},
            "required": ["points", "title"],
        },
    )
    async def chart(ctx: Context) -> ToolResult:
        note("start chart")
        blocks = [
            TextContent(type="text", text="a chart"),
            ImageContent(type="image", data=TINY_PNG, mimeType="image/png"),
        ]
        return ToolResult(content=blocks, structured_content={"points": 3, "title": "tiny"})

    @server.tool(task=TaskConfig(mode="required"), description="Fails, as a task.")
    async def spill() -> str:
        note("start spill")
        raise ValueError("the milk was spilt")

    @server.tool(task=TaskConfig(mode="optional"), description="Nap for `seconds` seconds.")
    async def nap(seconds: float, ctx: Context) -> str:
        await waited("nap", seconds, ctx)
        return "rested"

    return server


def main() -> None:
    port, ledger = int(sys.argv[1]), Path(sys.argv[2])
    build(ledger).run(transport="http", host="127.0.0.1", port=port, path="/mcp", show_banner=False)


if __name__ == "__main__":
    main()
