"""MCP tasks, both generations, from the shared state in Redis (task_store.py): the protocol's one room.

A task is a queued call whose callId is its taskId. Any gateway process answers for it: the record says
who created it and its states before an envelope, the envelope (the worker's, under the callId) says how
it ended. Another principal's task is "not found", like one that never existed or expired.

- 2026-07-28, the `io.modelcontextprotocol/tasks` extension (SEP-2663), advertised in `server/discover`:
  a `tools/call` whose `_meta` client capabilities list the extension is answered with a flat
  `resultType: "task"` result once the call is enqueued and its record stored; `tasks/get` inlines the
  result (or the input requests), `tasks/update` delivers input responses, `tasks/cancel` acknowledges;
  the `Mcp-Name` header, when the client sets it, must name the request's taskId.
- 2025-11-25 (SEP-1686): the `tasks` capability, `execution.taskSupport` per tool (catalog.py),
  `tools/call` with `params.task` → `CreateTaskResult`, `tasks/get`, `tasks/result` (blocks until the
  task ends, and sends `notifications/tasks/status` on its stream first), `tasks/list`, `tasks/cancel`.
- Push (2026-07-28): a `subscriptions/listen` whose filter names `taskIds` gets `notifications/tasks` (the
  task as `tasks/get` gives it) on each change of those tasks, read from Redis every poll interval
  (task_listen.py). How each generation shows a task: task_views.py.

Built on the SDK's extension points: `Server.extensions` (what `server/discover` advertises),
`add_request_handler` (the `tasks/*` methods), `Server.middleware` (the SDK serves 2025-11-25 without tasks
and would hold a `CreateTaskResult` to the shape of a `CallToolResult`: the middleware answers that
`tools/call` whole), the listen handler's `SubscriptionBus`, and `get_capabilities` (TaskServer: the
2025-11-25 `tasks` capability).

A tool result with `isError` is a *completed* task (every envelope is a tool result); `failed` is for a
call whose envelope cannot be read. Cancelling a call that has not started withdraws it from its queue
(never sent upstream): the task is `cancelled`; so is one whose call waits on a task of its MCP server (the
worker polling it sends `tasks/cancel` there, worker/call/mcp_task.py). Another running call cannot be
stopped: 2026-07-28 keeps the task `working` with a status message saying so (it then completes);
2025-11-25, whose rules make a cancelled task `cancelled`, says in its message that the call ran on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import mcp_types as types
import structlog
from mcp.server.context import CallNext, HandlerResult
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types import methods as wire_methods
from mcp_types.jsonrpc import HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field, ValidationError
from starlette.requests import Request

from worker.constants import MAX_CALL_TIMEOUT_S, PROGRAM_TOOL
from worker.definitions.model import Tool
from worker.gateway.calls import Calls, CallSpec
from worker.gateway.mcp.task_listen import Notification, TaskWatch, principal, send
from worker.gateway.mcp.task_store import Cursor, TaskRecord, TaskStore, new_task_id, now_iso
from worker.gateway.mcp.task_views import (
    RELATED_TASK_META_KEY,
    Generation,
    TaskView,
    detailed,
    task_2025,
    task_2026,
    task_result,
    view_of,
)
from worker.settings import Settings

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

    Context = ServerRequestContext[Any, Any]

log = structlog.get_logger("toolworker.gateway.tasks")

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
MCP_NAME_HEADER = "mcp-name"
# tasks/result waits for the envelope in slices, looking again at the record (a cancel) between them.
RESULT_SLICE_S = 2.0
LIST_PAGE_SIZE = 50
CallHandler = Callable[["Context", types.CallToolRequestParams], Awaitable[dict[str, Any]]]

WITHDRAWN_MESSAGE = "Cancelled before it started: the call was taken off its queue and never sent upstream."
UPSTREAM_CANCELLED = "Cancelled: the task it waited on at its MCP server is cancelled too (tasks/cancel)."
PROGRAM_CANCELLED = "Cancelled: the program stops; its tool calls that had not started were withdrawn."
RUNNING_2026 = (
    "Cancellation was asked, but the call had already started on a worker and cannot be stopped: it runs to "
    "its end, and this task completes with its result."
)
RUNNING_2025 = (
    "Cancelled, but the call had already started on a worker and could not be stopped: it ran on to its end upstream."
)


class TaskIdParams(types.RequestParams):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    task_id: str = Field(alias="taskId", min_length=1, max_length=256)


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class ListParams(types.RequestParams):
    model_config = ConfigDict(extra="allow")
    cursor: str | None = None


class TaskServer(Server[Any]):
    """The SDK's server, with the 2025-11-25 `tasks` capability in what handshake-era clients are told."""

    def get_capabilities(
        self,
        notification_options: Any = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        found = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        if protocol_version in MODERN_PROTOCOL_VERSIONS or "tasks/get" not in self._request_handlers:
            return found
        tasks = types.ServerTasksCapability.model_validate(
            {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        )
        return found.model_copy(update={"tasks": tasks})


class McpTasks:
    """The task methods of the MCP server, over the gateway's calls and the task store."""

    def __init__(self, calls: Calls, store: TaskStore, default_ttl_s: int, max_ttl_s: int, poll_ms: int) -> None:
        self.calls = calls
        self.store = store
        self.default_ttl_ms = default_ttl_s * 1000
        self.max_ttl_ms = max_ttl_s * 1000
        self.poll_ms = poll_ms
        self._call_tool: CallHandler | None = None
        self.watch = TaskWatch(calls, store, poll_ms)

    def install(self, server: Server[Any], call_tool: CallHandler) -> None:
        """Advertise tasks and serve their methods on `server`; `call_tool` is the front end's `tools/call`
        handler, for the task-augmented calls of 2025-11-25 that this module answers itself."""
        self._call_tool = call_tool
        server.extensions[TASKS_EXTENSION] = {}
        server.middleware.append(self._legacy_tool_call)
        server.add_request_handler("tasks/get", TaskIdParams, self.get)
        server.add_request_handler("tasks/update", UpdateParams, self.update)
        server.add_request_handler("tasks/cancel", TaskIdParams, self.cancel)
        server.add_request_handler("tasks/result", TaskIdParams, self.result)
        server.add_request_handler("tasks/list", ListParams, self.list_tasks)

    @classmethod
    def of(cls, calls: Calls, settings: Settings) -> McpTasks:
        return cls(
            calls,
            TaskStore(calls.redis),
            settings.task_ttl_seconds,
            max(settings.task_ttl_seconds, settings.result_ttl_seconds),
            settings.task_poll_interval_ms,
        )

    # --- creation ---------------------------------------------------------------------------------

    def requested(self, ctx: Context, params: types.CallToolRequestParams, tool: Tool) -> Generation | None:
        """Whether this `tools/call` runs as a task, and in which generation's words; raises for a tool whose
        task mode the request does not meet."""
        mode = tool.task_mode
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            opted_in = _opted_in(ctx)
            if mode == "required" and not opted_in:
                raise MCPError(
                    code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                    message=f"The tool {tool.name!r} runs only as a task: opt in to {TASKS_EXTENSION}.",
                    data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
                )
            return "2026" if opted_in and mode != "forbidden" else None
        if params.task is None:
            if mode == "required":
                raise MCPError(
                    code=types.METHOD_NOT_FOUND,
                    message=f"The tool {tool.name!r} runs only as a task (params.task).",
                )
            return None
        if mode == "forbidden":
            raise MCPError(code=types.METHOD_NOT_FOUND, message=f"The tool {tool.name!r} does not run as a task.")
        return "2025"

    async def create(
        self, spec: CallSpec, tool: Tool, generation: Generation, params: types.CallToolRequestParams
    ) -> dict[str, Any]:
        """Store the task, enqueue its call under the task's id, and answer with the task."""
        asked = params.task.ttl if params.task is not None else None
        ttl_ms = min(int(asked), self.max_ttl_ms) if asked is not None and asked > 0 else self.default_ttl_ms
        task_id, created = new_task_id(), now_iso()
        who = spec.principal
        record = TaskRecord(
            task_id=task_id,
            principal=who.name,
            tenant=who.tenant,
            tool=tool.name,
            created_at=created,
            last_updated_at=created,
            ttl_ms=ttl_ms,
            poll_interval_ms=self.poll_ms,
            status_message="The call is queued or running.",
        )
        await self.store.create(record)
        # The call may wait and run as long as the task is kept (not the gateway's timeout of a direct call).
        # Its upstream's progress is relayed all the same: the last message is the task's status (relay.py).
        timeout_s = min(ttl_ms / 1000, MAX_CALL_TIMEOUT_S)
        spec = replace(spec, call_id=task_id, timeout_s=timeout_s, relay={"progress": True})
        try:
            submitted = await self.calls.submit(spec)
        except BaseException:
            await self.store.delete(task_id)
            raise
        self.calls.hold(submitted)
        log.info("gateway.task_created", taskId=task_id, tool=tool.name, generation=generation)
        view = TaskView(record, None)
        if generation == "2026":
            return {**task_2026(view), "resultType": "task"}
        return {"task": task_2025(view)}

    # --- tasks/get, tasks/result, tasks/list --------------------------------------------------------

    async def get(self, ctx: Context, params: TaskIdParams) -> dict[str, Any]:
        view = await self._view(ctx, params.task_id)
        if _generation(ctx) == "2025":
            return task_2025(view)
        return {**detailed(view), "resultType": "complete"}

    async def result(self, ctx: Context, params: TaskIdParams) -> dict[str, Any]:
        """2025-11-25 `tasks/result`: the call's tool result, once the task has ended (it waits)."""
        _only(ctx, "2025")
        view = await self._view(ctx, params.task_id)
        while not view.terminal:
            envelope = await self.calls.wait(view.record.task_id, RESULT_SLICE_S)
            view = await self._view(ctx, params.task_id) if envelope is None else TaskView(view.record, envelope)
        await _tell_status(ctx, view)
        if view.envelope is None or view.status != "completed":
            raise MCPError(code=types.INVALID_PARAMS, message=f"Task {params.task_id} was cancelled: it has no result.")
        return task_result(view.envelope, view.record.task_id, "2025")

    async def list_tasks(self, ctx: Context, params: ListParams) -> dict[str, Any]:
        _only(ctx, "2025")
        after = _decode_cursor(params.cursor)
        records, more = await self.store.page(principal(ctx).name, after, LIST_PAGE_SIZE)
        views = await asyncio.gather(*(view_of(self.calls, record) for record in records))
        answer: dict[str, Any] = {"tasks": [task_2025(view) for view in views]}
        if more is not None:
            answer["nextCursor"] = _encode_cursor(more)
        return answer

    # --- tasks/update, tasks/cancel -----------------------------------------------------------------

    async def update(self, ctx: Context, params: UpdateParams) -> dict[str, Any]:
        """Answers to a task's input requests: stored for whoever asked, and the task works again."""
        _only(ctx, "2026")
        view = await self._view(ctx, params.task_id)
        if view.status != "input_required":
            raise MCPError(code=types.INVALID_PARAMS, message=f"Task {params.task_id} asks no input now.")
        await self.store.update(
            view.record, status="working", input_requests=None, input_responses=params.input_responses
        )
        return {"resultType": "complete"}

    async def cancel(self, ctx: Context, params: TaskIdParams) -> dict[str, Any]:
        generation = _generation(ctx)
        view = await self._view(ctx, params.task_id)
        if not view.terminal:
            view = await self._cancel(view, generation)
        elif generation == "2025":
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"Task {params.task_id} has already ended ({view.status})."
            )
        return task_2025(view) if generation == "2025" else {"resultType": "complete"}

    async def _cancel(self, view: TaskView, generation: Generation) -> TaskView:
        record = view.record
        if await self.calls.withdraw(record.task_id, record.tool, record.tenant):
            log.info("gateway.task_cancelled", taskId=record.task_id, withdrawn=True)
            return TaskView(await self.store.update(record, status="cancelled", status_message=WITHDRAWN_MESSAGE), None)
        if record.tool == PROGRAM_TOOL and await self.calls.cancel_program(record.task_id, record.tenant):
            log.info("gateway.task_cancelled", taskId=record.task_id, program=True)
            return TaskView(await self.store.update(record, status="cancelled", status_message=PROGRAM_CANCELLED), None)
        if await self.calls.cancel_upstream_task(record.task_id):
            log.info("gateway.task_cancelled", taskId=record.task_id, upstream_task=True)
            cancelled = await self.store.update(record, status="cancelled", status_message=UPSTREAM_CANCELLED)
            return TaskView(cancelled, None)
        envelope = await self.calls.wait(record.task_id, 0.0)
        if envelope is not None:  # it ended meanwhile
            return TaskView(record, envelope)
        log.info("gateway.task_cancelled", taskId=record.task_id, withdrawn=False)
        if generation == "2025":
            return TaskView(await self.store.update(record, status="cancelled", status_message=RUNNING_2025), None)
        return TaskView(await self.store.update(record, status_message=RUNNING_2026), None)

    # --- reading ------------------------------------------------------------------------------------

    async def _view(self, ctx: Context, task_id: str) -> TaskView:
        _check_name_header(ctx, task_id)
        record = await self.store.get(task_id, principal(ctx).name)
        if record is None:  # one answer for unknown, expired and another principal's
            raise MCPError(code=types.INVALID_PARAMS, message=f"Task {task_id} not found")
        return await view_of(self.calls, record)

    # --- 2025-11-25 tools/call ------------------------------------------------------------------------

    async def _legacy_tool_call(self, ctx: Context, call_next: CallNext) -> HandlerResult:
        """A task-augmented `tools/call` on a handshake-era connection: answered here, whole, since the
        SDK would hold its `CreateTaskResult` to the shape of a `CallToolResult`."""
        raw = ctx.params or {}
        if ctx.method != "tools/call" or _generation(ctx) != "2025" or raw.get("task") is None:
            return await call_next(ctx)
        try:
            wire_methods.validate_client_request("tools/call", ctx.protocol_version, raw)
            params = types.CallToolRequestParams.model_validate(raw, by_name=False)
        except (KeyError, ValueError, ValidationError):
            raise MCPError(code=types.INVALID_PARAMS, message="Invalid request parameters") from None
        if self._call_tool is None:
            return await call_next(ctx)
        answer = await self._call_tool(ctx, params)
        if "task" in answer:
            return answer
        return wire_methods.serialize_server_result("tools/call", ctx.protocol_version, answer)


async def _tell_status(ctx: Context, view: TaskView) -> None:
    """`notifications/tasks/status` on the `tasks/result` request's own stream (where one is open)."""
    params = {**task_2025(view), "_meta": {RELATED_TASK_META_KEY: {"taskId": view.record.task_id}}}
    try:
        await send(ctx, Notification(method="notifications/tasks/status", params=params))
    except Exception as exc:  # a client that cannot take it still gets the result
        log.info("gateway.task_status_not_sent", taskId=view.record.task_id, error=str(exc))


def _generation(ctx: Context) -> Generation:
    return "2026" if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else "2025"


def _only(ctx: Context, generation: Generation) -> None:
    """A method of one generation's tasks (2026-07-28 dropped `tasks/result` and `tasks/list`; `tasks/update`
    is its own) is not found in the other."""
    if _generation(ctx) != generation:
        raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=ctx.method)


def _opted_in(ctx: Context) -> bool:
    """Whether the request's client capabilities (2026-07-28 `_meta`) list the tasks extension."""
    capabilities = (ctx.meta or {}).get(types.CLIENT_CAPABILITIES_META_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions


def _check_name_header(ctx: Context, task_id: str) -> None:
    """The `Mcp-Name` header a client sets on `tasks/*` (for routing) must name the request's task."""
    if not isinstance(ctx.request, Request):
        return
    named = ctx.request.headers.get(MCP_NAME_HEADER)
    if named is not None and named != task_id:
        raise MCPError(code=HEADER_MISMATCH, message="The Mcp-Name header does not match params.taskId.")


def _encode_cursor(cursor: Cursor) -> str:
    score, task_id = cursor
    return base64.urlsafe_b64encode(f"tasks:{score!r}:{task_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str | None) -> Cursor | None:
    """The position a `tasks/list` cursor names; one this server did not give is error -32602."""
    if cursor is None:
        return None
    try:
        prefix, score, task_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().split(":")
        if prefix == "tasks" and task_id:
            return float(score), task_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise MCPError(code=types.INVALID_PARAMS, message="Invalid cursor")
