"""What a handler is given (a `Job`: a call admitted to run) and what it gives back (an `Answer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.definitions.model import Tool, Upstream
from worker.errors import ToolError
from worker.http.transport import PreparedRequest, Response
from worker.protocol import ToolCall


@dataclass(frozen=True, slots=True)
class Job:
    """A call admitted to run: its tool and upstream resolved, its arguments valid, its deadline known."""

    call: ToolCall
    tool: Tool
    upstream: Upstream
    arguments: dict[str, Any]
    deadline: float


@dataclass(frozen=True, slots=True)
class Answer:
    """How a call ended, as its handler tells it; `shaping.envelope` alone turns it into the envelope."""

    # The request as last prepared (the envelope describes it), None when none was.
    request: PreparedRequest | None = None
    response: Response | None = None
    # An answer the worker makes itself (the catalog tools).
    text: str | None = None
    attempts: int = 0
    # How the call failed once it was admitted (before, during or after its attempts).
    error: ToolError | None = None
    # A paginated tool's: the pages read, the argument to continue with, why it stopped early.
    pages: int | None = None
    next_cursor: str | None = None
    note: str | None = None
    # An MCP server's `tools/call` result, as it came (worker/call/mcp_tool.py).
    mcp: dict[str, Any] | None = None
