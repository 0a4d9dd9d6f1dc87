"""Upstream tasks as the `mcp` SDK's client reaches them: the 2026-07-28 `io.modelcontextprotocol/tasks`
extension (SEP-2663), through the SDK's extension points, never hand-written JSON-RPC.

- `UpstreamTasks`, a `ClientExtension`: declares the extension (every request of a session built with it
  carries it in its `_meta` client capabilities, so the server may run a `tools/call` as a task) and the
  `ResultClaim` of `resultType: "task"`, so that the session's `call_tool(..., allow_claimed=True)`
  returns the server's flat `CreateTaskResult` (`Created`) instead of refusing it;
- `tasks/get` and `tasks/cancel` sent by the session's `send_request` with their own result types
  (`TaskState`: the task, and on `completed` its `tools/call` result inlined, on `failed` its error).

A server that speaks 2025-11-25 (a session opened with `initialize`) has tasks in that revision's form, reached
with the SDK's own request types: `tools/call` with `params.task` answered by a `CreateTaskResult`, `tasks/get`
for the state, `tasks/result` for a completed (or failed) task's outcome, `tasks/cancel` (`LegacyTasks`). Its
tasks are bound to the session that created them (the spec's rule): the task's record keeps that session, and a
worker that replaces a lost one polls the task on it (ServerSpec.session; challenges.Watch sends the requests
after its own handshake on the session recorded).

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
from mcp.client.session import ClientSession
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    RequestParams,
    Result,
    Task,
    TaskMetadata,
)
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.methods import validate_server_result
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
    # A task waiting for input: the server's requests, by its keys for them (answered with tasks/update).
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")
    # A 2025-11-25 task waiting for input: its requests come on the stream of `tasks/result` (LegacyTasks).
    asks_on_result: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def call_result(self) -> CallToolResult:
        """A completed task's `tools/call` result."""
        return CallToolResult.model_validate(self.result or {})


class TaskIdParams(RequestParams):
    task_id: str = Field(serialization_alias="taskId")


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(serialization_alias="inputResponses")


class UpdateTask(mcp_types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams


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


class LegacyTasks:
    """Upstream tasks in the 2025-11-25 form, on a session that negotiated `version` (see the module)."""

    def __init__(self, session: ClientSession, version: str) -> None:
        self._session = session
        self._version = version

    async def start(
        self, name: str, arguments: dict[str, Any], timeout_s: float, ttl_ms: int
    ) -> CallToolResult | Created:
        """`tools/call` with `task`: the task the server created, or the tool's result when it ran it inline.

        The session's `send_request` holds every `tools/call` answer to `CallToolResult`, which a
        `CreateTaskResult` is not: this one request goes through the session's dispatcher, as `send_request`
        sends it (the handshake-era stamp is the protocol-version header), and its answer is read with the
        SDK's models of either shape."""
        params = CallToolRequestParams(name=name, arguments=arguments, task=TaskMetadata(ttl=ttl_ms))
        request = CallToolRequest(params=params).model_dump(by_alias=True, mode="json", exclude_none=True)
        opts: CallOptions = {"timeout": timeout_s, "headers": {MCP_PROTOCOL_VERSION_HEADER: self._version}}
        dispatcher = self._session._dispatcher  # the session's own sender (see above)
        raw = await dispatcher.send_raw_request(request["method"], request["params"], opts)
        if "task" in raw:
            return Created.model_validate({**_flat(CreateTaskResult.model_validate(raw).task), "resultType": "task"})
        validate_server_result(request["method"], self._version, raw)
        return CallToolResult.model_validate(raw)

    async def state(self, task_id: str, timeout_s: float) -> TaskState:
        """`tasks/get`; once the task ended completed or failed, its outcome from `tasks/result` inlined."""
        request = GetTaskRequest(params=GetTaskRequestParams(task_id=task_id))
        task = await self._session.send_request(request, GetTaskResult, timeout_s)
        state = TaskState.model_validate(_flat(task))
        if task.status == "input_required":
            return state.model_copy(update={"asks_on_result": True})
        if task.status not in ("completed", "failed"):
            return state
        try:
            result = await self.result(task_id, timeout_s)
        except MCPError as exc:  # the tool's failure, as the server reports it
            return state.model_copy(update={"status": "failed", "error": exc.error.model_dump(exclude_none=True)})
        # An outcome (isError or not) is the tool's answer, mapped like an inline one.
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return state.model_copy(update={"status": "completed", "result": dumped})

    async def result(self, task_id: str, timeout_s: float) -> CallToolResult:
        """`tasks/result`: waits for the task's end, its requests for input coming meanwhile on the session."""
        payload = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task_id))
        return await self._session.send_request(payload, CallToolResult, timeout_s)

    async def cancel(self, task_id: str, timeout_s: float) -> None:
        request = CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id))
        await self._session.send_request(request, CancelTaskResult, timeout_s)


def _flat(task: Task) -> dict[str, Any]:
    """A 2025-11-25 task's fields under the names the 2026-07-28 extension gives them."""
    return {
        "taskId": task.task_id,
        "status": task.status,
        "statusMessage": task.status_message,
        "pollIntervalMs": task.poll_interval,
        "ttlMs": task.ttl,
    }
