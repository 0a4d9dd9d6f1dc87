"""The catalog tools (`catalog_list`, `catalog_schema`, `catalog_search`): answered by the worker from its
definitions, through the queue like any other tool, for orchestrators that only know how to enqueue."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from worker.call.job import Answer, Job
from worker.call.runtime import Runtime
from worker.definitions import catalog
from worker.definitions.model import ToolSet


class CatalogTool:
    """Answers from the toolset the worker serves; nothing is sent anywhere."""

    async def answer(self, job: Job, runtime: Runtime) -> Answer:
        return Answer(text=run_catalog(job.tool.name, job.arguments, runtime.toolset))


def run_catalog(name: str, arguments: Mapping[str, Any], toolset: ToolSet) -> str:
    """The JSON text answer of a catalog tool."""
    handlers: dict[str, Callable[[], Any]] = {
        "catalog_list": lambda: catalog.list_tools(toolset, arguments.get("tags")),
        "catalog_schema": lambda: catalog.schemas(toolset, arguments["names"]),
        "catalog_search": lambda: catalog.search(toolset, arguments["question"], arguments.get("top_k", 5)),
    }
    return json.dumps(handlers[name](), ensure_ascii=False)
