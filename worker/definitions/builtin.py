"""The built-in tools a worker serves beside the defined ones: the catalog tools (answered from the
definitions) and `http_request` (served while an egress allow-list is set). Their definitions live here,
for the workers, the gateway and the CLI alike; their handlers in worker/call/."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.constants import (
    HTTP_REQUEST_TOOL,
    KIND_CATALOG,
    KIND_HTTP_REQUEST,
    KIND_PROGRAM,
    PROGRAM_TOOL,
    WORKER_UPSTREAM,
)
from worker.definitions import catalog
from worker.definitions.model import RequestTemplate, Tool, ToolSet, Upstream
from worker.definitions.templates import Template

_TAGS = {"type": "array", "items": {"type": "string"}, "description": "Only tools with one of these tags."}
_CATALOG: dict[str, tuple[str, dict[str, Any]]] = {
    "catalog_list": (
        "List the available tools (name, method, path, summary, tags, upstream), optionally by tags.",
        {"type": "object", "properties": {"tags": _TAGS}, "additionalProperties": False},
    ),
    "catalog_schema": (
        "The full definitions (with input schemas) of the named tools, and which names are missing.",
        {
            "type": "object",
            "properties": {"names": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
            "required": ["names"],
            "additionalProperties": False,
        },
    ),
    "catalog_search": (
        "Find the tools that best match a question, best first.",
        catalog.SEARCH_SCHEMA,
    ),
}


_DESCRIPTION = (
    "Send an HTTP request to a URL and return the response body. Only hosts on the operator's egress"
    " allow-list can be reached. A JSON object body is sent as JSON unless the Content-Type header is"
    " application/x-www-form-urlencoded; a string body is sent as it is."
)
_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "method": {
            "type": "string",
            "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
            "default": "GET",
            "description": "The HTTP method.",
        },
        "url": {"type": "string", "description": "The absolute http:// or https:// URL, query string included."},
        "body": {
            "type": ["string", "object", "array", "null"],
            "description": "The request body: a JSON object or array, or a string sent as it is.",
        },
        "headers": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Request headers, name to value.",
        },
    },
    "required": ["url"],
    "additionalProperties": False,
}


def catalog_tools(upstream: str) -> list[Tool]:
    return [
        Tool(
            name=name,
            upstream=upstream,
            request=RequestTemplate(method="POST"),
            description=description,
            tags=("catalog",),
            schema=schema,
            kind=KIND_CATALOG,
        )
        for name, (description, schema) in _CATALOG.items()
    ]


def http_request_tool(upstream: str) -> Tool:
    """The tool's definition, served only while an egress allow-list is set."""
    return Tool(
        name=HTTP_REQUEST_TOOL,
        upstream=upstream,
        request=RequestTemplate(method="GET"),
        description=_DESCRIPTION,
        tags=("http",),
        schema=dict(_SCHEMA),
        kind=KIND_HTTP_REQUEST,
    )


_PROGRAM_DESCRIPTION = (
    "Run a short Python program against the tools: `await tools.<name>(**arguments)` calls a tool and returns"
    " its structured answer (else its text); a failed call raises `ToolError` (its text names the tool, exit"
    " code and HTTP status). `asyncio.gather(...)` runs calls in parallel. Imports: json, re, math, datetime,"
    " asyncio. The answer is the value of the last expression, plus what the program printed. Find tools"
    " with `search_tools` and their Python signatures with `get_tool_schema`."
)
_PROGRAM_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "minLength": 1, "description": "The program's text."}},
    "required": ["code"],
    "additionalProperties": False,
}


def program_tool(upstream: str) -> Tool:
    """`run_code` (code mode): offered by a gateway in code mode or with TOOLWORKER_CODE_MODE on."""
    return Tool(
        name=PROGRAM_TOOL,
        upstream=upstream,
        request=RequestTemplate(method="POST"),
        description=_PROGRAM_DESCRIPTION,
        tags=("code",),
        schema=dict(_PROGRAM_SCHEMA),
        kind=KIND_PROGRAM,
    )


def served_toolset(toolset: ToolSet, http_request_enabled: bool, code_mode: bool = False) -> ToolSet:
    """The toolset a worker serves: the defined tools, the catalog tools, `http_request` if enabled (and,
    at a gateway in code mode, `run_code`: the workers run programs whatever their toolset)."""
    served = ToolSet(
        dict(toolset.upstreams),
        dict(toolset.tools),
        list(toolset.problems),
        dict(toolset.unusable),
        dict(toolset.tenants),
        notices=list(toolset.notices),
        unlisted=toolset.unlisted,
    )
    served.upstreams[WORKER_UPSTREAM] = Upstream(WORKER_UPSTREAM, Template.literal(""))
    extra = catalog_tools(WORKER_UPSTREAM) + ([http_request_tool(WORKER_UPSTREAM)] if http_request_enabled else [])
    extra += [program_tool(WORKER_UPSTREAM)] if code_mode else []
    for tool in extra:
        served.tools.setdefault(tool.name, tool)
    return served
