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
  task as `tasks/get` gives it) on each change of those tasks, read from Redis every poll interval.

Built on the SDK's extension points: `Server.extensions` (what `server/discover` advertises),
`add_request_handler` (the `tasks/*` methods), `Server.middleware` (the SDK serves 2025-11-25 without tasks
and would hold a `CreateTaskResult` to the shape of a `CallToolResult`: the middleware answers that
`tools/call` whole), the listen handler's `SubscriptionBus`, and `get_capabilities` (TaskServer: the
2025-11-25 `tasks` capability).

A tool result with `isError` is a *completed* task (every envelope is a tool result); `failed` is for a
call whose envelope cannot be read. Cancelling a call that has not started withdraws it from its queue
(never sent upstream): the task is `cancelled`. A call already running cannot be stopped: 2026-07-28
keeps the task `working` with a status message saying so (it then completes); 2025-11-25, whose rules
make a cancelled task `cancelled`, says in its message that the call ran on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import mcp_types as types
import structlog
from mcp.server.context import CallNext, HandlerResult
from mcp.server.lowlevel.server import Server
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY, ServerEvent, event_matches, event_to_notification
from mcp_types import methods as wire_methods
from mcp_types.jsonrpc import HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from worker.constants import MAX_CALL_TIMEOUT_S
from worker.definitions.model import Tool
from worker.envelope import ToolResult
from worker.gateway.calls import Calls, CallSpec
from worker.gateway.identity.principals import LOCAL, Principal, principal_of
from worker.gateway.mcp.results import tool_result
from worker.gateway.mcp.task_store import Cursor, TaskRecord, TaskStore, new_task_id, now_iso
from worker.settings import Settings

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

    Context = ServerRequestContext[Any, Any]

log = structlog.get_logger("toolworker.gateway.tasks")

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"
MCP_NAME_HEADER = "mcp-name"
# tasks/result waits for the envelope in slices, looking again at the record (a cancel) between them.
RESULT_SLICE_S = 2.0
LIST_PAGE_SIZE = 50
# A listen stream's bound on list-changed events waiting to be sent, and on the tasks it watches.
LISTEN_BACKLOG = 1024
MAX_LISTENED_TASKS = 100
Generation = Literal["2026", "2025"]
Status = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL = frozenset({"completed", "failed", "cancelled"})
CallHandler = Callable[["Context", types.CallToolRequestParams], Awaitable[dict[str, Any]]]

WITHDRAWN_MESSAGE = "Cancelled before it started: the call was taken off its queue and never sent upstream."
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


@dataclass(frozen=True)
class TaskView:
    """A task as it stands: its record and, once the call is answered, its envelope."""

    record: TaskRecord
    envelope: ToolResult | None

    @property
    def status(self) -> Status:
        if self.record.status == "cancelled":
            return "cancelled"
        if self.envelope is not None:
            return "completed"
        return self.record.status

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


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
        spec = replace(spec, call_id=task_id, timeout_s=min(ttl_ms / 1000, MAX_CALL_TIMEOUT_S))
        try:
            submitted = await self.calls.submit(spec)
        except BaseException:
            await self.store.delete(task_id)
            raise
        await self.calls.hold(submitted, spec)
        log.info("gateway.task_created", taskId=task_id, tool=tool.name, generation=generation)
        view = TaskView(record, None)
        if generation == "2026":
            return {**_task_2026(view), "resultType": "task"}
        return {"task": _task_2025(view)}

    # --- tasks/get, tasks/result, tasks/list --------------------------------------------------------

    async def get(self, ctx: Context, params: TaskIdParams) -> dict[str, Any]:
        view = await self._view(ctx, params.task_id)
        if _generation(ctx) == "2025":
            return _task_2025(view)
        return {**_detailed(view), "resultType": "complete"}

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
        return _tool_result(view.envelope, view.record.task_id, "2025")

    async def list_tasks(self, ctx: Context, params: ListParams) -> dict[str, Any]:
        _only(ctx, "2025")
        after = _decode_cursor(params.cursor)
        records, more = await self.store.page(_principal(ctx).name, after, LIST_PAGE_SIZE)
        views = await asyncio.gather(*(self._envelope_view(record) for record in records))
        answer: dict[str, Any] = {"tasks": [_task_2025(view) for view in views]}
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
        return _task_2025(view) if generation == "2025" else {"resultType": "complete"}

    async def _cancel(self, view: TaskView, generation: Generation) -> TaskView:
        record = view.record
        if await self.calls.withdraw(record.task_id, record.tool, record.tenant):
            log.info("gateway.task_cancelled", taskId=record.task_id, withdrawn=True)
            return TaskView(await self.store.update(record, status="cancelled", status_message=WITHDRAWN_MESSAGE), None)
        envelope = await self.calls.wait(record.task_id, 0.0)
        if envelope is not None:  # it ended meanwhile
            return TaskView(record, envelope)
        log.info("gateway.task_cancelled", taskId=record.task_id, withdrawn=False)
        if generation == "2025":
            return TaskView(await self.store.update(record, status="cancelled", status_message=RUNNING_2025), None)
        return TaskView(await self.store.update(record, status_message=RUNNING_2026), None)

    # --- notifications/tasks on subscriptions/listen (2026-07-28) ------------------------------------

    async def listen(
        self, ctx: Context, requested: types.SubscriptionFilter, task_ids: list[str], bus: SubscriptionBus
    ) -> types.SubscriptionsListenResult:
        """A listen stream whose filter names `taskIds`: `notifications/tasks` (the task as `tasks/get` gives it)
        whenever one of them changes, beside the list-changed events the filter also asks for. It ends once
        every named task has ended, unless it listens for those too. Another principal's task is never told of.
        """
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        honored = types.SubscriptionFilter.model_validate(
            {**requested.model_dump(by_alias=True, exclude_none=True), "taskIds": task_ids}
        )
        events: asyncio.Queue[ServerEvent] = asyncio.Queue(maxsize=LISTEN_BACKLOG)
        uris = frozenset(honored.resource_subscriptions or ())

        def deliver(event: ServerEvent) -> None:
            if event_matches(honored, uris, event) and not events.full():
                events.put_nowait(event)

        unsubscribe = bus.subscribe(deliver)
        try:
            acknowledged = types.SubscriptionsAcknowledgedNotificationParams(notifications=honored, _meta=meta)
            await _send(ctx, types.SubscriptionsAcknowledgedNotification(params=acknowledged))
            keep_open = any(
                (requested.tools_list_changed, requested.prompts_list_changed, requested.resources_list_changed, uris)
            )
            await self._watch(ctx, task_ids, events, meta, keep_open)
        finally:
            unsubscribe()
        return types.SubscriptionsListenResult(_meta=meta)

    async def _watch(
        self,
        ctx: Context,
        task_ids: list[str],
        events: asyncio.Queue[ServerEvent],
        meta: dict[str, Any],
        keep_open: bool,
    ) -> None:
        principal, told = _principal(ctx).name, dict[str, Any]()
        watched: list[str] = list(dict.fromkeys(task_ids))
        while watched or keep_open:
            for task_id in list(watched):
                record = await self.store.get(task_id, principal)
                view = None if record is None else await self._envelope_view(record)
                if view is None or view.terminal:
                    watched.remove(task_id)
                if view is None:
                    continue
                detailed = _detailed(view)
                now = {key: value for key, value in detailed.items() if key != "lastUpdatedAt"}
                if told.get(task_id) != now:
                    told[task_id] = now
                    await _send(ctx, _Notification(method="notifications/tasks", params={**detailed, "_meta": meta}))
            try:
                event = await asyncio.wait_for(events.get(), self.poll_ms / 1000)
            except TimeoutError:
                continue
            await _send(ctx, event_to_notification(event, meta))

    # --- reading ------------------------------------------------------------------------------------

    async def _view(self, ctx: Context, task_id: str) -> TaskView:
        _check_name_header(ctx, task_id)
        record = await self.store.get(task_id, _principal(ctx).name)
        if record is None:  # one answer for unknown, expired and another principal's
            raise MCPError(code=types.INVALID_PARAMS, message=f"Task {task_id} not found")
        return await self._envelope_view(record)

    async def _envelope_view(self, record: TaskRecord) -> TaskView:
        if record.status == "cancelled":
            return TaskView(record, None)
        return TaskView(record, await self.calls.wait(record.task_id, 0.0))

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


def _detailed(view: TaskView) -> dict[str, Any]:
    """A 2026-07-28 task with its outcome inline: the tool result, the input requests, or the error."""
    answer = _task_2026(view)
    if view.status == "completed" and view.envelope is not None:
        answer["result"] = _tool_result(view.envelope, view.record.task_id, "2026")
    elif view.status == "input_required":
        answer["inputRequests"] = view.record.input_requests or {}
    elif view.status == "failed":
        answer["error"] = {"code": types.INTERNAL_ERROR, "message": view.record.status_message or "failed"}
    return answer


def _task_2026(view: TaskView) -> dict[str, Any]:
    record = view.record
    answer: dict[str, Any] = {
        "taskId": record.task_id,
        "status": view.status,
        "createdAt": record.created_at,
        "lastUpdatedAt": _last_updated(view),
        "ttlMs": record.ttl_ms,
        "pollIntervalMs": record.poll_interval_ms,
    }
    message = _status_message(view)
    if message:
        answer["statusMessage"] = message
    return answer


def _task_2025(view: TaskView) -> dict[str, Any]:
    answer = _task_2026(view)
    answer["ttl"] = answer.pop("ttlMs")
    answer["pollInterval"] = answer.pop("pollIntervalMs")
    return answer


def _status_message(view: TaskView) -> str | None:
    if view.status == "completed" and view.envelope is not None:
        ended = "succeeded" if view.envelope.exit_code == 0 else f"failed (exit code {view.envelope.exit_code})"
        return f"The call {ended}; the tool result tells more."
    return view.record.status_message


def _last_updated(view: TaskView) -> str:
    """The record's last change; for a completed task, now (the envelope carries no time of its own)."""
    return now_iso() if view.status == "completed" else view.record.last_updated_at


def _tool_result(envelope: ToolResult, task_id: str, generation: Generation) -> dict[str, Any]:
    answer = tool_result(envelope, task_id, 0.0)
    if generation == "2025":
        answer.pop("resultType", None)
        answer["_meta"] = {**answer.get("_meta", {}), RELATED_TASK_META_KEY: {"taskId": task_id}}
    return answer


async def _tell_status(ctx: Context, view: TaskView) -> None:
    """`notifications/tasks/status` on the `tasks/result` request's own stream (where one is open)."""
    params = {**_task_2025(view), "_meta": {RELATED_TASK_META_KEY: {"taskId": view.record.task_id}}}
    try:
        await _send(ctx, _Notification(method="notifications/tasks/status", params=params))
    except Exception as exc:  # a client that cannot take it still gets the result
        log.info("gateway.task_status_not_sent", taskId=view.record.task_id, error=str(exc))


async def _send(ctx: Context, notification: BaseModel) -> None:
    """A notification on the request's own stream (the SDK types only the core vocabulary; it sends any model)."""
    await ctx.session.send_notification(notification, related_request_id=ctx.request_id)  # type: ignore[arg-type]


class TaskListen:
    """`subscriptions/listen`: the SDK's handler, unless the filter names `taskIds` (the tasks extension's key,
    which the SDK's handler does not know): then McpTasks.listen."""

    def __init__(self, bus: SubscriptionBus, tasks: McpTasks | None) -> None:
        self._bus = bus
        self._sdk = ListenHandler(bus)
        self._tasks = tasks

    async def __call__(self, ctx: Context, params: types.SubscriptionsListenRequestParams) -> Any:
        task_ids = (params.notifications.model_extra or {}).get("taskIds")
        if self._tasks is None or not task_ids:
            return await self._sdk(ctx, params)
        if not isinstance(task_ids, list) or not all(isinstance(task_id, str) for task_id in task_ids):
            raise MCPError(code=types.INVALID_PARAMS, message="taskIds must be a list of task ids")
        return await self._tasks.listen(ctx, params.notifications, task_ids[:MAX_LISTENED_TASKS], self._bus)


class _Notification(BaseModel):
    method: str
    params: dict[str, Any]


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


def _principal(ctx: Context) -> Principal:
    return principal_of(ctx.request.scope) if isinstance(ctx.request, Request) else LOCAL


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
