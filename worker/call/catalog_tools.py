"""The catalog tools (`catalog_list`, `catalog_schema`, `catalog_search`): answered by the worker from its
definitions, through the queue like any other tool, for orchestrators that only know how to enqueue."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from worker.call.handlers import Job
from worker.call.runtime import Runtime
from worker.constants import KIND_CATALOG
from worker.definitions import catalog
from worker.definitions.model import RequestTemplate, Tool, ToolSet
from worker.envelope import ToolResult

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


class CatalogTool:
    """Answers from the toolset the worker serves; nothing is sent anywhere."""

    async def answer(self, job: Job, runtime: Runtime, envelope: ToolResult) -> None:
        envelope.result = run_catalog(job.tool.name, job.arguments, runtime.toolset)


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


def run_catalog(name: str, arguments: Mapping[str, Any], toolset: ToolSet) -> str:
    """The JSON text answer of a catalog tool."""
    handlers: dict[str, Callable[[], Any]] = {
        "catalog_list": lambda: catalog.list_tools(toolset, arguments.get("tags")),
        "catalog_schema": lambda: catalog.schemas(toolset, arguments["names"]),
        "catalog_search": lambda: catalog.search(toolset, arguments["question"], arguments.get("top_k", 5)),
    }
    return json.dumps(handlers[name](), ensure_ascii=False)
