"""One step of a task through the `mcp` SDK 1.x's experimental task API (2025-11-25, SEP-1686).

Run by the side environment's Python (`make task-clients`), never imported by the tests: the command is
JSON in argv[1] (`url`, `token`, `action`, `tool`, `arguments`, `ttl`, `taskId`), the outcome is JSON on stdout
(with the server's `tasks` capability and the notifications the client received). One client, one
connection per run.

- `start`: `session.experimental.call_tool_as_task` → the `CreateTaskResult`, then disconnect;
- `get`: `get_task`; `result`: `get_task_result(taskId, CallToolResult)` (blocks until the task ends);
  `cancel`: `cancel_task`; `list`: `list_tasks`; `tools`: `list_tools` (each tool's `execution`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult, PaginatedRequestParams


def dump(model: Any) -> dict[str, Any]:
    return dict(model.model_dump(mode="json", by_alias=True, exclude_none=True))


async def step(session: ClientSession, command: dict[str, Any]) -> dict[str, Any]:
    tasks, action = session.experimental, command["action"]
    if action == "start":
        ttl = command.get("ttl", 600_000)
        created = await tasks.call_tool_as_task(command["tool"], command.get("arguments") or {}, ttl=ttl)
        return {"created": dump(created)}
    if action == "get":
        return {"task": dump(await tasks.get_task(command["taskId"]))}
    if action == "result":
        return {"result": dump(await tasks.get_task_result(command["taskId"], CallToolResult))}
    if action == "cancel":
        return {"task": dump(await tasks.cancel_task(command["taskId"]))}
    if action == "list":
        return {"tasks": dump(await tasks.list_tasks())}
    if action == "tools":
        executions, cursor = {}, None
        while True:
            listed = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
            executions.update({tool.name: dump(tool).get("execution") for tool in listed.tools})
            if not listed.nextCursor:
                return {"tools": executions}
            cursor = listed.nextCursor
    raise ValueError(f"unknown action {action!r}")


async def main(command: dict[str, Any]) -> dict[str, Any]:
    notifications: list[dict[str, Any]] = []

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", None)
        if root is not None and hasattr(root, "method"):
            notifications.append(dump(root))

    out: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {command['token']}"}
    read_timeout = timedelta(seconds=command.get("timeout", 5))
    try:
        async with (
            streamablehttp_client(command["url"], headers=headers) as (read, write, _),
            ClientSession(read, write, read_timeout, message_handler=on_message) as session,
        ):
            initialized = await session.initialize()
            tasks_capability = initialized.capabilities.tasks
            out["capabilities"] = dump(tasks_capability) if tasks_capability is not None else None
            try:
                out.update(await step(session, command))
            except McpError as exc:
                out["error"] = {"type": "McpError", "message": exc.error.message, "code": exc.error.code}
    except Exception as exc:  # the test asserts on what the client saw, errors included
        out["error"] = {"type": type(exc).__name__, "message": repr(exc), "code": None}
    out["notifications"] = notifications
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
