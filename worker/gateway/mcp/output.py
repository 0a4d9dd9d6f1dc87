"""Structured output in each MCP protocol generation: `outputSchema` in `tools/list`, `structuredContent` in
`tools/call` results.

2026-07-28 takes any JSON value (and any schema); the earlier revisions an object only, so an array is
wrapped as `{"items": [...]}` and its schema to match, and a scalar is not structured output there. A
tool that lists an `outputSchema` answers every success with a conforming `structuredContent` (the SDK
clients reject anything else): an answer without one (not JSON, cut as text, not conforming) is a tool
error whose text says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from worker.envelope import ToolResult

WRAP_KEY = "items"
NOT_STRUCTURED = (
    "This tool declares an output schema, but this answer is not structured output that conforms to it; "
    "its text follows."
)


def is_legacy(protocol_version: str | None) -> bool:
    """Whether a client speaks a revision before 2026-07-28 (objects only as structured output)."""
    return protocol_version in HANDSHAKE_PROTOCOL_VERSIONS


def listed(entry: Mapping[str, Any], protocol_version: str | None) -> Mapping[str, Any]:
    """A `tools/list` entry as this revision takes it (its outputSchema wrapped, or left out)."""
    schema = entry.get("outputSchema")
    if schema is None or not is_legacy(protocol_version):
        return entry
    wrapped = legacy_schema(schema)
    out = {key: value for key, value in entry.items() if key != "outputSchema"}
    if wrapped is not None:
        out["outputSchema"] = wrapped
    return out


def legacy_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """An output schema with an object at its root: as it is, an array's wrapped as `{"items": [...]}`,
    None for any other root (not structured output on those revisions)."""
    kind = schema.get("type")
    if kind == "object" or (kind is None and "properties" in schema):
        return dict(schema)
    if kind != "array":
        return None
    defs = {key: schema[key] for key in ("$defs", "definitions") if key in schema}
    inner = {key: value for key, value in schema.items() if key not in defs}
    return {"type": "object", "properties": {WRAP_KEY: inner}, "required": [WRAP_KEY], **defs}


def structured_content(envelope: ToolResult, protocol_version: str | None) -> tuple[bool, Any]:
    """(present, value): the envelope's parsed answer as this revision's structuredContent."""
    value = envelope.structured
    if envelope.exit_code != 0 or value is None:
        return False, None
    if not is_legacy(protocol_version):
        return True, value
    if isinstance(value, dict):
        return True, value
    if isinstance(value, list):
        return True, {WRAP_KEY: value}
    return False, None


def declares_schema(entry: Mapping[str, Any] | None) -> bool:
    return entry is not None and entry.get("outputSchema") is not None


def upstream_blocks(envelope: ToolResult, content: list[Any]) -> list[Any]:
    """An MCP upstream's content blocks as they came (an image stays an image), in place of the text made
    from them; when its text was cut, the cut text with the blocks that are not text. Other tools: `content`."""
    if envelope.content is None or envelope.exit_code not in (0, 22):
        return content
    blocks = list(envelope.content)
    if envelope.truncated:
        blocks = content[:1] + [block for block in blocks if block.get("type") != "text"]
    return blocks + content[1:]
