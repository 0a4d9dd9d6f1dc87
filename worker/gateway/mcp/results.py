"""A call's tool result as MCP clients read it (`CallToolResult`): the text the model reads, what it should know
besides, `_meta["toolworker/call"]`, and structured content in the shapes of the client's revision (output.py).

The one shape of a call's result, whether answered on `tools/call` (server.py) or by a task (tasks.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.definitions.model import Tool
from worker.envelope import ToolResult
from worker.gateway.mcp import output

CALL_META_KEY = "toolworker/call"


def tool_result(
    envelope: ToolResult | None,
    call_id: str,
    waited_s: float,
    tool: Tool | None = None,
    entry: Mapping[str, Any] | None = None,
    protocol_version: str | None = None,
) -> dict[str, Any]:
    """The `CallToolResult` of an envelope (or of a call still unanswered after `waited_s`), with the
    structured content this client's revision takes when the tool's `entry` was listed to it."""
    if envelope is None:
        text = (
            f"The call {call_id} has no result after {waited_s:g} seconds; it may still finish. "
            f"Its result can be fetched later with GET /v1/calls/{call_id}."
        )
        return text_result(text, is_error=True, meta={CALL_META_KEY: {"callId": call_id, "pending": True}})
    present, value = output.structured_content(envelope, protocol_version)
    not_structured = envelope.exit_code == 0 and output.declares_schema(entry) and not present
    notes = [output.NOT_STRUCTURED] if not_structured else []
    notes += model_notes(envelope, tool)
    result = text_result(
        result_text(envelope), envelope.exit_code != 0 or not_structured, {CALL_META_KEY: call_meta(envelope)}
    )
    if notes:
        result["content"].append({"type": "text", "text": "\n".join(notes)})
    result["content"] = output.upstream_blocks(envelope, result["content"])
    if present:
        result["structuredContent"] = value
    return result


def model_notes(envelope: ToolResult, tool: Tool | None) -> list[str]:
    """What the model should know besides the answer: what was cut, a note, how to continue a listing."""
    notes = []
    if envelope.truncation:
        notes.append(f"The answer was cut to fit: {envelope.truncation}.")
    if envelope.note:
        notes.append(envelope.note)
    if envelope.output:  # a program's (code mode)
        notes.append(f"The program printed:\n{envelope.output}")
    if envelope.next_cursor is not None:
        param = tool.pagination.param if tool is not None and tool.pagination is not None else "cursor"
        notes.append(
            f"{envelope.pages} page(s) read; more remain. To continue, call this tool again with the same "
            f"arguments and {param}={envelope.next_cursor!r}."
        )
    return notes


def result_text(envelope: ToolResult) -> str:
    """What the model reads: the result, or on failure the error message followed by the body, if any."""
    if envelope.exit_code == 0:
        return envelope.result
    message = (envelope.error or {}).get("message") or f"The call failed (exit code {envelope.exit_code})."
    if not envelope.result:
        return message
    label = "The response body (truncated):" if envelope.truncated else "The response body:"
    return f"{message}\n\n{label}\n{envelope.result}"


def call_meta(envelope: ToolResult) -> dict[str, Any]:
    return {
        "callId": envelope.call_id,
        "statusCode": envelope.status_code,
        "exitCode": envelope.exit_code,
        "truncated": envelope.truncated,
        "attempts": envelope.attempts,
        "durationMs": envelope.duration_ms,
        **{
            key: value
            for key, value in (
                ("pages", envelope.pages),
                ("next_cursor", envelope.next_cursor),
                ("truncation", envelope.truncation),
                ("cached", envelope.cached or None),
                ("age", envelope.age),
            )
            if value is not None
        },
    }


def text_result(text: str, is_error: bool, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": text}],
        "isError": is_error,
        "resultType": "complete",
    }
    if meta:
        result["_meta"] = meta
    return result
