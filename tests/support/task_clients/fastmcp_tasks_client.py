"""One step of a task through FastMCP 4's SEP-2663 task client (2026-07-28 `io.modelcontextprotocol/tasks`).

Run by the side environment's Python (`make task-clients`), never imported by the tests: the command is
JSON in argv[1] (`url`, `token`, `action`, `tool`, `arguments`, `created`), the outcome is JSON on stdout.
Each run is one client, one connection: it ends when the process does.

- `start`: `call_tool_task` → the task the server created (its raw `CreateTaskResult`), then disconnect;
- `status`: `ToolTask.status()` (`tasks/get`); `result`: `ToolTask.result()` (polls to the end);
  `cancel`: `ToolTask.cancel()` (`tasks/cancel`), then `status()`. The handle is rebuilt from `created`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from fastmcp import Client
from fastmcp_tasks import ToolTask, call_tool_task
from fastmcp_tasks.client_models import ClientCreateTaskResult


def dump(model: Any) -> dict[str, Any]:
    return dict(model.model_dump(mode="json", by_alias=True, exclude_none=True))


async def step(client: Client[Any], command: dict[str, Any]) -> dict[str, Any]:
    action = command["action"]
    if action == "start":
        task = await call_tool_task(client, command["tool"], command.get("arguments") or {})
        return {"created": dump(task.create_result)}
    created = ClientCreateTaskResult.model_validate(command["created"])
    task = ToolTask(client, command["tool"], created, raise_on_error=False)
    if action == "status":
        return {"status": dump(await task.status())}
    if action == "result":
        result = await task.result()
        texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
        return {"result": {"isError": result.is_error, "texts": texts, "meta": result.meta}}
    if action == "cancel":
        await task.cancel()
        return {"cancelled": True, "status": dump(await task.status())}
    raise ValueError(f"unknown action {action!r}")


async def main(command: dict[str, Any]) -> dict[str, Any]:
    client: Client[Any] = Client(command["url"], auth=command["token"], timeout=command.get("timeout", 5))
    try:
        async with client:
            return await step(client, command)
    except Exception as exc:  # the test asserts on what the client saw, errors included
        return {"error": {"type": type(exc).__name__, "message": str(exc), "code": _code(exc)}}


def _code(exc: BaseException) -> int | None:
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None) if error is not None else getattr(exc, "code", None)
    if code is None and exc.__cause__ is not None:
        return _code(exc.__cause__)
    return code if isinstance(code, int) else None


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
