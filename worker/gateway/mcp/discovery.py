"""Discovery mode: four meta-tools instead of the whole catalog, for catalogs too large to list.

A model that sees only these can still use every tool: list the tags and the tools of a tag (light
summaries), search by a question, get the schemas of the tools it picked, then call one by name. The
first three are answered by the gateway from its catalog; `call_tool` is a call like any other.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from worker.definitions import catalog, signatures
from worker.gateway.catalog import Snapshot

LIST_PAGE_SIZE = 50
MAX_SCHEMAS = 20
CALL_TOOL = "call_tool"

_READ_ONLY = {"readOnlyHint": True, "openWorldHint": False}
_NAMES = {"type": "array", "items": {"type": "string"}}
META_TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_tools",
        "description": (
            "List the available tools as light summaries (name, method, path, summary, tags), with every tag "
            "and its number of tools. Give `tags` to list only the tools of those tags; pass `cursor` from "
            "`nextCursor` for the next page."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "tags": {**_NAMES, "description": "Only tools with one of these tags."},
                "cursor": {"type": "string"},
            },
            "additionalProperties": False,
        },
        "annotations": _READ_ONLY,
    },
    {
        "name": "search_tools",
        "description": "Find the tools that best match a question, best first (light summaries with a score).",
        "inputSchema": catalog.SEARCH_SCHEMA,
        "annotations": _READ_ONLY,
    },
    {
        "name": "get_tool_schema",
        "description": (
            "The full definitions of the named tools (description and input schema), to call them with "
            "`call_tool`; names that are not tools are listed under `missing`."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"names": {**_NAMES, "minItems": 1, "maxItems": MAX_SCHEMAS}},
            "required": ["names"],
            "additionalProperties": False,
        },
        "annotations": _READ_ONLY,
    },
    {
        "name": CALL_TOOL,
        "description": (
            "Call a tool by name with its arguments (as its schema from `get_tool_schema` describes them); "
            "answers with the tool's result."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "object"}},
            "required": ["name"],
            "additionalProperties": False,
        },
        "annotations": {"openWorldHint": True},
    },
]
META_TOOL_NAMES = frozenset(tool["name"] for tool in META_TOOLS)
_VALIDATORS = {tool["name"]: Draft202012Validator(tool["inputSchema"]) for tool in META_TOOLS}


class InvalidMetaArguments(ValueError):
    """Arguments of a meta-tool that its schema refuses (the message names the field)."""


def check(name: str, arguments: Mapping[str, Any]) -> None:
    problems = [
        f"`{'.'.join(map(str, error.absolute_path)) or 'arguments'}`: {error.message}"
        for error in _VALIDATORS[name].iter_errors(dict(arguments))
    ]
    if problems:
        raise InvalidMetaArguments("Invalid arguments: " + "; ".join(problems[:5]) + ".")


def answer(name: str, arguments: Mapping[str, Any], snapshot: Snapshot) -> str:
    """The JSON text answer of `list_tools`, `search_tools` or `get_tool_schema`."""
    check(name, arguments)
    if name == "list_tools":
        result: Any = _list(snapshot, arguments.get("tags") or [], arguments.get("cursor"))
    elif name == "search_tools":
        result = catalog.search(snapshot.toolset, arguments["question"], arguments.get("top_k", 5))
    else:
        result = with_signatures(snapshot, list(dict.fromkeys(arguments["names"])))
    return json.dumps(result, ensure_ascii=False)


def with_signatures(snapshot: Snapshot, names: list[str]) -> dict[str, Any]:
    """`get_tool_schema`'s answer: each tool's MCP entry with `python`, the signature a program calls it by
    (code mode), and the names that are no tool."""
    tools = []
    for entry in snapshot.mcp_tools(names):
        tool = snapshot.tool(str(entry["name"]))
        tools.append({**entry, "python": signatures.signature(tool)} if tool is not None else entry)
    return {"tools": tools, "missing": [n for n in names if snapshot.tool(n) is None]}


def _list(snapshot: Snapshot, tags: list[str], cursor: str | None) -> dict[str, Any]:
    rows = catalog.list_tools(snapshot.toolset, tags)
    start = _offset(cursor)
    page = rows[start : start + LIST_PAGE_SIZE]
    out: dict[str, Any] = {"tags": snapshot.tags(), "total": len(rows), "tools": page}
    if start + LIST_PAGE_SIZE < len(rows):
        out["nextCursor"] = base64.urlsafe_b64encode(str(start + LIST_PAGE_SIZE).encode()).decode()
    return out


def _offset(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        return max(0, int(base64.urlsafe_b64decode(cursor.encode())))
    except (ValueError, binascii.Error):
        raise InvalidMetaArguments("Invalid arguments: `cursor` is not a cursor this tool gave.") from None
