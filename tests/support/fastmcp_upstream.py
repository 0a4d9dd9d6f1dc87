"""A FastMCP 4 server with background tasks (the SEP-2663 `io.modelcontextprotocol/tasks` extension), run as a
process by the upstream task tests with FastMCP's own Python (.venv/task-clients/fastmcp4):
`python tests/support/fastmcp_upstream.py PORT LEDGER`. Never imported by the tests.

Every start and every end of a task's body is a line appended to the file LEDGER (`start brew`, `cancelled
brew`, `done brew`), so a test counts how many times the server ran a tool, and whether its task was
cancelled, across processes and restarts of the caller.

- `brew(seconds)`: task `required`; reports progress with a message while it waits, then answers text;
- `chart()`: task `required`; answers an image block and structuredContent under an outputSchema;
- `spill()`: task `required`; fails (its task ends `failed`);
- `nap(seconds)`: task `optional` (a task only when the caller asks for one), answers text;
- `roast()`: task `required`; asks which roast (an `input_required` task, FastMCP's guard pattern), answers it;
- `pick()`: no task; asks which flavour within its `tools/call` (an `input_required` result), answers it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp_types
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

    add_asking_tools(server, note)
    return server


def question(key: str, message: str, choices: list[str]) -> mcp_types.InputRequiredResult:
    """One form question (an enum of `choices` under `key`), as a guard tool asks it."""
    schema = {"type": "object", "properties": {key: {"type": "string", "enum": choices}}, "required": [key]}
    asked = mcp_types.ElicitRequest(params=mcp_types.ElicitRequestFormParams(message=message, requested_schema=schema))
    return mcp_types.InputRequiredResult(input_requests={key: asked})


def answered(ctx: Context, key: str) -> str | None:
    """The answer to `key`, as the tool reports it ("decline" and the like); None when not yet asked."""
    answer = (ctx.input_responses or {}).get(key)
    if answer is None:
        return None
    if not isinstance(answer, mcp_types.ElicitResult):
        answer = mcp_types.ElicitResult.model_validate(answer)
    return str((answer.content or {}).get(key)) if answer.action == "accept" else answer.action


def add_asking_tools(server: FastMCP, note: Callable[[str], None]) -> None:
    """The tools that ask for input with FastMCP's guard pattern: as a task, and within a tools/call."""

    @server.tool(task=TaskConfig(mode="required"), description="Roasts the beans the caller picks, as a task.")
    async def roast(ctx: Context) -> Any:
        choice = answered(ctx, "roast")
        if choice is None:
            note("asked roast")
            return question("roast", "Which roast?", ["light", "dark"])
        note("done roast")
        return f"roast: {choice}"

    @server.tool(description="Scoops the flavour the caller picks.")
    async def pick(ctx: Context) -> Any:
        choice = answered(ctx, "flavour")
        if choice is None:
            return question("flavour", "Which flavour?", ["vanilla", "pistachio"])
        return f"flavour: {choice}"


def main() -> None:
    port, ledger = int(sys.argv[1]), Path(sys.argv[2])
    build(ledger).run(transport="http", host="127.0.0.1", port=port, path="/mcp", show_banner=False)


if __name__ == "__main__":
    main()
