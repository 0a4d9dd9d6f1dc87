"""Tools the worker answers itself: the catalog (SPEC §2.3) and, when an allow-list is set, the
generic HTTP request tool (SPEC §2.2.4). Both go through the queue like any other tool."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from worker.call.http_request import (
    GENERIC_TOOL_ALIASES,
    GENERIC_TOOL_DESCRIPTION,
    GENERIC_TOOL_NAME,
    GENERIC_TOOL_SCHEMA,
)
from worker.definitions import catalog
from worker.definitions.model import RequestTemplate, Tool, ToolSet, Upstream
from worker.definitions.templates import Template
from worker.http.egress import EgressPolicy

BUILTIN_UPSTREAM = "toolworker"
ALIASES = dict.fromkeys(GENERIC_TOOL_ALIASES, GENERIC_TOOL_NAME)

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
        {
            "type": "object",
            "properties": {
                "question": {"type": "string", "minLength": 1},
                "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
            },
            "required": ["question"],
            "additionalProperties": False,
        },
    ),
}


def with_builtins(toolset: ToolSet, policy: EgressPolicy) -> ToolSet:
    """The toolset a worker serves: the defined tools, the catalog tools, the generic tool if enabled."""
    served = ToolSet(dict(toolset.upstreams), dict(toolset.tools), list(toolset.problems), dict(toolset.unusable))
    served.upstreams[BUILTIN_UPSTREAM] = Upstream(BUILTIN_UPSTREAM, Template.literal(""))
    for name, (description, schema) in _CATALOG.items():
        served.tools.setdefault(name, _builtin(name, description, schema, "builtin", ("catalog",)))
    if policy.enabled:
        generic = _builtin(GENERIC_TOOL_NAME, GENERIC_TOOL_DESCRIPTION, dict(GENERIC_TOOL_SCHEMA), "generic", ("http",))
        served.tools.setdefault(GENERIC_TOOL_NAME, generic)
    return served


def _builtin(name: str, description: str, schema: dict[str, Any], kind: str, tags: tuple[str, ...]) -> Tool:
    return Tool(
        name=name,
        upstream=BUILTIN_UPSTREAM,
        request=RequestTemplate(method="POST" if kind == "builtin" else "GET"),
        description=description,
        tags=tags,
        schema=schema,
        kind=kind,
    )


def run_catalog(name: str, arguments: Mapping[str, Any], toolset: ToolSet) -> str:
    """The JSON text answer of a catalog tool."""
    handlers: dict[str, Callable[[], Any]] = {
        "catalog_list": lambda: catalog.list_tools(toolset, arguments.get("tags")),
        "catalog_schema": lambda: catalog.schemas(toolset, arguments["names"]),
        "catalog_search": lambda: catalog.search(toolset, arguments["question"], arguments.get("top_k", 5)),
    }
    return json.dumps(handlers[name](), ensure_ascii=False)
