"""Upstream tasks as the `mcp` SDK's client reaches them: the 2026-07-28 `io.modelcontextprotocol/tasks`
extension (SEP-2663), through the SDK's extension points, never hand-written JSON-RPC.

- `UpstreamTasks`, a `ClientExtension`: declares the extension (every request of a session built with it
  carries it in its `_meta` client capabilities, so the server may run a `tools/call` as a task) and the
  `ResultClaim` of `resultType: "task"`, so that the session's `call_tool(..., allow_claimed=True)`
  returns the server's flat `CreateTaskResult` (`Created`) instead of refusing it;
- `tasks/get` and `tasks/cancel` sent by the session's `send_request` with their own result types
  (`TaskState`: the task, and on `completed` its `tools/call` result inlined, on `failed` its error).

The claim's resolver is never used to wait: the worker polls by itself (worker/call/mcp_task.py) so that
the task's id is stored before it waits, and a worker lost meanwhile is replaced by one that polls the same
task. A session built with the extension is a session of its own (ServerSpec.tasks), so that tools called
without it keep running inline where their server lets them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import mcp_types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, RequestParams, Result
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import ConfigDict, Field

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class _TaskFields(Result):
    """The flat fields of a task as the server sends them (camelCase on the wire)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    ttl_ms: int | None = Field(default=None, alias="ttlMs")


class Created(_TaskFields):
    """A `tools/call` the server runs as a task: the task, to poll."""

    result_type: Literal["task"] = Field(alias="resultType")


class TaskState(_TaskFields):
    """`tasks/get`: the task, with its outcome inlined once it ended."""

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def call_result(self) -> CallToolResult:
        """A completed task's `tools/call` result."""
        return CallToolResult.model_validate(self.result or {})


class TaskIdParams(RequestParams):
    task_id: str = Field(serialization_alias="taskId")


class GetTask(mcp_types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams


class CancelTask(mcp_types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams


async def _unresolved(created: Created, context: ClaimContext) -> CallToolResult:
    """The claim's resolver, which the worker never asks for (it polls by itself): says so if it were."""
    raise RuntimeError(f"The task {created.task_id} of {context.tool_name!r} is polled by the worker, not here.")


class UpstreamTasks(ClientExtension):
    """The client half of `io.modelcontextprotocol/tasks`: its capability ad and its `resultType: "task"`."""

    identifier = TASKS_EXTENSION

    def settings(self) -> dict[str, Any]:
        return {}

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=Created, resolve=_unresolved),)


class TasksRequired(Exception):
    """The server refused a `tools/call` unread because the tool runs only as a task (-32021 naming the
    tasks extension): sent again as a task, it runs once."""


def tasks_required(exc: BaseException) -> bool:
    if not isinstance(exc, MCPError) or exc.code != MISSING_REQUIRED_CLIENT_CAPABILITY:
        return False
    data = exc.error.data if isinstance(exc.error.data, dict) else {}
    wanted = (data.get("requiredCapabilities") or {}).get("extensions") or {}
    return TASKS_EXTENSION in wanted
