"""Code mode's MCP face: `search_tools`, `get_tool_schema` (with each tool's Python signature) and `run_code`.

A model in code mode (`--mode code`, TOOLWORKER_GATEWAY_MODE=code) sees these three instead of the catalog:
it finds the tools it needs, reads their signatures, and sends one program (`run_code`, a call like any
other: the workers run it, worker/queue/programs.py). In `all` and `discovery` modes `run_code` is offered
beside the other tools when TOOLWORKER_CODE_MODE is on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from worker.constants import PROGRAM_TOOL
from worker.definitions import catalog
from worker.gateway.catalog import Snapshot
from worker.gateway.mcp import discovery
from worker.settings import Settings

META_TOOLS: list[dict[str, Any]] = [
    next(tool for tool in discovery.META_TOOLS if tool["name"] == "search_tools"),
    {
        **next(tool for tool in discovery.META_TOOLS if tool["name"] == "get_tool_schema"),
        "description": (
            "The named tools' definitions: description, JSON input schema, and `python`, the signature a "
            "program calls it by (`await tools.<name>(...)` in `run_code`); names that are not tools are "
            "listed under `missing`."
        ),
    },
]
META_TOOL_NAMES = frozenset(tool["name"] for tool in META_TOOLS)


def listed(snapshot: Snapshot) -> list[Mapping[str, Any]]:
    """What a code-mode client lists: the two meta-tools and `run_code` (when its principal may run code)."""
    return [*META_TOOLS, *snapshot.mcp_tools([PROGRAM_TOOL])]


def answer(name: str, arguments: Mapping[str, Any], snapshot: Snapshot) -> str:
    """The JSON text answer of `search_tools` or `get_tool_schema` (`run_code` itself left out of both)."""
    discovery.check(name, arguments)
    if name == "search_tools":
        found = catalog.search(snapshot.toolset, arguments["question"], arguments.get("top_k", 5))
        return json.dumps([row for row in found if row.get("name") != PROGRAM_TOOL], ensure_ascii=False)
    return json.dumps(discovery.with_signatures(snapshot, list(dict.fromkeys(arguments["names"]))), ensure_ascii=False)


def settings_for(settings: Settings, mode: str) -> Settings:
    """The gateway's settings in this mode: `run_code` is always offered in code mode."""
    return settings.model_copy(update={"code_mode": True}) if mode == "code" else settings
