"""One session per MCP server per process, reused by every call: the SDK's `Client` (protocol 2026-07-28 where
the server offers it, else `initialize`), entered in a task of its own that holds it open until the process
closes it (the transport then ends the session with DELETE). A session the server no longer knows (404) is
opened again and the request, refused unread, sent again once; a session whose connection broke is opened
again by the next call. A request the server refused for its credential (401, 403) fails as `Challenged`, with
the server's challenge.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import httpx2
import structlog
from mcp.client import Client
from mcp.client.session import MessageHandlerFnT
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    HEADER_MISMATCH,
    CallToolResult,
    EmptyResult,
    InputRequiredResult,
    Result,
    SetLevelRequest,
    SetLevelRequestParams,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from worker import errors
from worker.mcp_client.challenges import Watch
from worker.mcp_client.connections import http_client
from worker.mcp_client.failures import Unsent, mapped, session_gone
from worker.mcp_client.list_changed import OnToolsChanged, held_open, tools_changed_handler
from worker.mcp_client.relay import CallRelay, InFlight
from worker.mcp_client.spec import ServerSpec
from worker.mcp_client.tasks import (
    CancelTask,
    Created,
    GetTask,
    LegacyTasks,
    TaskIdParams,
    TasksRequired,
    TaskState,
    UpdateTask,
    UpdateTaskParams,
    UpstreamTasks,
)
from worker.mcp_client.tasks import tasks_required as _tasks_required

log = structlog.get_logger("toolworker.mcp")
# How long a server's streams may stay silent before the SDK gives up on them (its own default).
STREAM_READ_TIMEOUT_S = 300.0
# Pages of tools/list read at most (a server whose cursors never end).
MAX_LIST_PAGES = 100
# Input rounds of one tools/call at most (the SDK's own driver stops at 10 as well); a round that carries only
# the server's state is sent again after a wait that doubles from STATE_ONLY_WAIT_S, as the SDK's driver does.
MAX_INPUT_ROUNDS = 10
STATE_ONLY_WAIT_S = 0.05
STATE_ONLY_MAX_WAIT_S = 0.25
# How long a 2025-11-25 server is asked to keep a task past the call's time (its ttl), for a last poll.
KEEP_TASK_S = 60.0
T = TypeVar("T")


class Held:
    """A session held open by a task of its own (the SDK's task groups live and die in the task that
    entered them), until `close`."""

    def __init__(self, spec: ServerSpec, on_tools_changed: OnToolsChanged | None = None) -> None:
        self.spec = spec
        self.watch = Watch(spec.session)  # the last 401 or 403 the server answered, the session it gave
        self._on_tools_changed = on_tools_changed
        self.in_flight = InFlight()
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(self._hold(), name=f"mcp-session-{spec.name}")

    async def client(self) -> Client:
        return await asyncio.shield(self._ready)

    @property
    def alive(self) -> bool:
        return not self._task.done()

    async def _hold(self) -> None:
        try:
            handler = tools_changed_handler(self.spec.name, self._on_tools_changed)
            async with _client(self.spec, self.watch, self.in_flight.callbacks(), handler) as client:
                self._ready.set_result(client)
                await held_open(client, self._stop, handler is not None, self.spec.name)
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                log.info("mcp.session_ended", upstream=self.spec.name, reason=type(exc).__name__)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise

    async def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._task, self.spec.timeout_s)
        if not self._ready.done():
            self._ready.cancel()


@contextlib.asynccontextmanager
async def _client(
    spec: ServerSpec, watch: Watch, callbacks: dict[str, Any], message_handler: MessageHandlerFnT | None = None
) -> AsyncIterator[Client]:
    """The SDK's client of one server, its handshake done; `callbacks` answer what the server asks (relay.py),
    `message_handler` hears its notifications (list_changed.py)."""
    headers = dict(spec.headers)
    timeout = httpx2.Timeout(spec.timeout_s, connect=spec.connect_timeout_s, read=STREAM_READ_TIMEOUT_S)
    async with contextlib.AsyncExitStack() as stack:
        if spec.transport == "sse":
            transport: Any = sse_client(spec.url, headers, spec.connect_timeout_s, STREAM_READ_TIMEOUT_S)
            mode = "legacy"
        else:
            # The SDK leaves a client it was given open: closed here, after the session.
            http = await stack.enter_async_context(http_client(headers, timeout, watch))
            transport, mode = streamable_http_client(spec.url, http_client=http), "auto"
        extensions = [UpstreamTasks()] if spec.tasks else None
        client = Client(
            transport,
            mode=mode,
            cache=None,
            read_timeout_seconds=spec.timeout_s,
            message_handler=message_handler,
            extensions=extensions,
            **callbacks,
        )
        yield await stack.enter_async_context(client)


async def _sent(
    client: Client, name: str, arguments: dict[str, Any], timeout_s: float, relay: CallRelay | None = None
) -> CallToolResult:
    """`tools/call` on the session itself (a third of the client's work per call, measured); a server that
    wants the tool listed first (HEADER_MISMATCH) is answered through the client, which lists and sends again.
    The call's progress goes to its relay, when its caller listens, and so do the questions of a 2026-07-28
    server's `input_required` rounds (they are the call's own: no session of its own is needed for them)."""
    relay = relay or CallRelay()
    progress = relay.progress_callback
    deadline = time.monotonic() + timeout_s
    responses: dict[str, Any] | None = None
    state: str | None = None
    for leg in range(MAX_INPUT_ROUNDS + 1):
        try:
            result = await client.session.call_tool(
                name,
                arguments,
                read_timeout_seconds=max(deadline - time.monotonic(), 0.001),
                progress_callback=progress,
                input_responses=responses,
                request_state=state,
                allow_input_required=True,
            )
        except MCPError as exc:
            if _tasks_required(exc):
                raise TasksRequired(exc.error.message) from exc
            if exc.code != HEADER_MISMATCH or leg > 0:
                raise
            return await client.call_tool(name, arguments, read_timeout_seconds=timeout_s, progress_callback=progress)
        if not isinstance(result, InputRequiredResult):
            break
        # A 2026-07-28 server asks for input within the call: this call's own questions, answered for it.
        state = result.request_state
        if result.input_requests:
            responses = await relay.answer_inputs(result.input_requests)
        else:  # its state alone: sent again a little later, as the SDK's own driver does
            responses = None
            await asyncio.sleep(min(STATE_ONLY_WAIT_S * 2**leg, STATE_ONLY_MAX_WAIT_S))
    else:
        raise errors.ReceiveFailed(f"The MCP server asked for input more than {MAX_INPUT_ROUNDS} times in one call.")
    if not isinstance(result, CallToolResult):  # only asked-for shapes (claims) differ
        raise errors.ReceiveFailed(f"The MCP server answered tools/call with a {type(result).__name__}.")
    return result


async def _started(client: Client, name: str, arguments: dict[str, Any], timeout_s: float) -> CallToolResult | Created:
    """`tools/call` that may be answered with a task (the extension's claim, returned as it came; a 2025-11-25
    server's `CreateTaskResult`, its task kept as long as the call may last)."""
    session = client.session
    legacy = _legacy_tasks(client)
    if legacy is not None:
        return await legacy.start(name, arguments, timeout_s, ttl_ms=round((timeout_s + KEEP_TASK_S) * 1000))
    try:
        result = await session.call_tool(name, arguments, read_timeout_seconds=timeout_s, allow_claimed=True)
    except MCPError as exc:
        if exc.code != HEADER_MISMATCH:
            raise
        await client.list_tools()  # the server wants the tool listed first (its x-mcp-header parameters)
        result = await session.call_tool(name, arguments, read_timeout_seconds=timeout_s, allow_claimed=True)
    if not isinstance(result, CallToolResult | Created):
        raise errors.ReceiveFailed(f"The MCP server answered tools/call with a {type(result).__name__}.")
    return result


def _legacy_tasks(client: Client) -> LegacyTasks | None:
    """The 2025-11-25 form of tasks, on a session that negotiated a handshake-era revision."""
    version = client.protocol_version
    return LegacyTasks(client.session, version) if version in HANDSHAKE_PROTOCOL_VERSIONS else None


async def _task_state(client: Client, task_id: str, timeout_s: float) -> TaskState:
    legacy = _legacy_tasks(client)
    if legacy is not None:
        return await legacy.state(task_id, timeout_s)
    return await client.session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), TaskState, timeout_s)


async def _cancel_task(client: Client, task_id: str, timeout_s: float) -> None:
    legacy = _legacy_tasks(client)
    if legacy is not None:
        return await legacy.cancel(task_id, timeout_s)
    await client.session.send_request(CancelTask(params=TaskIdParams(task_id=task_id)), Result, timeout_s)


def _tasked(spec: ServerSpec) -> ServerSpec:
    return spec if spec.tasks else replace(spec, tasks=True)


class Sessions:
    """The sessions of one process, one per server, opened on first use."""

    def __init__(self) -> None:
        # By the whole spec: a server reached with different credentials (each user's token) is a session each.
        self._held: dict[ServerSpec, Held] = {}
        self._locks: dict[ServerSpec, asyncio.Lock] = {}
        self.handshakes = 0
        # Told the upstream's name when a server says its tools changed (set by whoever refreshes listings).
        self.on_tools_changed: OnToolsChanged | None = None

    async def client(self, spec: ServerSpec) -> Client:
        """The server's open session; opened now when there is none, or the one there was has ended."""
        held = self._held.get(spec)
        if held is not None and held.alive:
            try:  # another call's handshake, which may yet fail
                return await held.client()
            except Exception as exc:
                raise mapped(exc, spec.name) from exc
        async with self._locks.setdefault(spec, asyncio.Lock()):
            held = self._held.get(spec)
            if held is None or not held.alive:
                if held is not None:
                    await held.close()
                held = self._held[spec] = Held(spec, self.on_tools_changed)
                self.handshakes += 1
            try:
                return await asyncio.wait_for(held.client(), spec.connect_timeout_s + spec.timeout_s)
            except BaseException as exc:
                self._held.pop(spec, None)
                await held.close()
                raise held.watch.take(spec.name) or mapped(exc, spec.name) from exc

    async def call_tool(
        self,
        spec: ServerSpec,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float,
        relay: CallRelay | None = None,
    ) -> CallToolResult:
        """`tools/call` on the server's session (a new session and once again when the server lost it);
        a timeout sends `notifications/cancelled` (the SDK's). Unsent: no session could be opened.
        TasksRequired: the server runs this tool only as a task (refused unread). What the server sends during
        the call goes to `relay` (on a session of the call's own when it needs one)."""
        relay = relay or CallRelay()
        if not await self._shares(spec, relay):
            return await self._call_alone(spec, name, arguments, timeout_s, relay)
        wait_s = max(timeout_s, 0.001)
        return await self._on_session(spec, lambda client: _sent(client, name, arguments, wait_s, relay), relay)

    async def _shares(self, spec: ServerSpec, relay: CallRelay) -> bool:
        """Whether the call runs on the process's session: it needs none of its own, or it needs one only for
        the server's questions and its server asks them within the call (2026-07-28: they are the call's own)."""
        if not relay.own_session:
            return True
        if relay.wants.log_level is not None:  # log messages name no call, in either generation
            return False
        try:
            client = await self.client(spec)
        except Exception:  # the shared session's failure is reported by the call on it
            return True
        return client.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def start_task(
        self, spec: ServerSpec, name: str, arguments: dict[str, Any], timeout_s: float
    ) -> CallToolResult | Created:
        """`tools/call` on the session that declares the tasks extension: the task the server created, or
        its result when it ran the tool inline."""
        spec = _tasked(spec)
        return await self._on_session(spec, lambda client: _started(client, name, arguments, max(timeout_s, 0.001)))

    def task_session(self, spec: ServerSpec) -> str | None:
        """The session a task just created on the server is bound to: a 2025-11-25 server's (None where the
        server gave no session id: 2026-07-28, whose tasks are the server's by their ids alone)."""
        held = self._held.get(_tasked(spec))
        return held.watch.session_id if held is not None else None

    async def end_resumed(self, spec: ServerSpec) -> None:
        """End the session a resumed task was polled on (`spec.session`): DELETE, and the server forgets it."""
        await self.forget(_tasked(spec))
        self._locks.pop(_tasked(spec), None)

    async def task_state(self, spec: ServerSpec, task_id: str, timeout_s: float) -> TaskState:
        """`tasks/get`: a task is the server's by its id, whichever session (or worker) created it (a 2025-11-25
        server's: the session that created it)."""
        return await self._on_session(_tasked(spec), lambda c: _task_state(c, task_id, max(timeout_s, 0.001)))

    async def update_task(self, spec: ServerSpec, task_id: str, responses: dict[str, Any], timeout_s: float) -> None:
        """`tasks/update`: the answers to a task's input requests (2026-07-28)."""
        request = UpdateTask(params=UpdateTaskParams(task_id=task_id, input_responses=responses))
        await self._on_session(_tasked(spec), lambda c: c.session.send_request(request, Result, max(timeout_s, 0.001)))

    async def task_result(self, spec: ServerSpec, task_id: str, timeout_s: float, relay: CallRelay) -> CallToolResult:
        """A 2025-11-25 task's `tasks/result` (it waits for the task's end): what the server asks for meanwhile,
        naming the task, goes to `relay`."""
        spec = _tasked(spec)

        async def asked(client: Client) -> CallToolResult:
            legacy = _legacy_tasks(client)
            if legacy is None:
                raise errors.ReceiveFailed(f"The MCP server {spec.name!r} has no tasks/result (2026-07-28).")
            in_flight = self._held[spec].in_flight.tasks
            in_flight[task_id] = relay
            try:
                return await legacy.result(task_id, max(timeout_s, 0.001))
            finally:
                in_flight.pop(task_id, None)

        return await self._on_session(spec, asked)

    async def cancel_task(self, spec: ServerSpec, task_id: str, timeout_s: float) -> None:
        """`tasks/cancel` (acknowledged; the task's state then says whether it ended cancelled)."""
        await self._on_session(_tasked(spec), lambda c: _cancel_task(c, task_id, max(timeout_s, 0.001)))

    async def _on_session(
        self, spec: ServerSpec, send: Callable[[Client], Awaitable[T]], relay: CallRelay | None = None
    ) -> T:
        """One request on the server's session, sent again once on a new session when the server lost it;
        `relay` is the call's while it is in flight there (the server's requests go to it)."""
        for last in (False, True):
            try:
                client = await self.client(spec)
            except errors.ToolError as exc:
                raise Unsent(exc) from exc
            in_flight = self._held[spec].in_flight.calls if spec in self._held and relay is not None else []
            if relay is not None:
                in_flight.append(relay)
            try:
                return await send(client)
            except TasksRequired:
                raise
            except Exception as exc:
                if session_gone(exc) and not last:
                    await self.forget(spec)
                    continue
                challenged = self._challenged(spec)
                # the connection broke, or the credential was refused: the next call opens a new session
                if not self._alive(spec) or challenged is not None:
                    await self.forget(spec)
                raise challenged or mapped(exc, spec.name) from exc
            finally:
                if relay in in_flight:
                    in_flight.remove(relay)
        raise AssertionError("unreachable: the last try returns or raises")

    async def _call_alone(
        self, spec: ServerSpec, name: str, arguments: dict[str, Any], timeout_s: float, relay: CallRelay
    ) -> CallToolResult:
        """`tools/call` on a session opened for this call alone (its log level, the server's requests its own),
        ended with it."""
        watch = Watch()
        failure: Exception | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:  # entered in this task (the SDK's task groups must be left by the task that entered them)
                    async with asyncio.timeout(spec.connect_timeout_s + spec.timeout_s):
                        client = await stack.enter_async_context(_client(spec, watch, relay.callbacks()))
                except Exception as exc:
                    raise watch.take(spec.name) or Unsent(mapped(exc, spec.name)) from exc
                self.handshakes += 1
                level = relay.wants.log_level
                if level is not None and client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
                    with contextlib.suppress(MCPError):  # a server without logging: nothing to hear
                        # The request itself: the SDK's helper warns that 2026-07-28 dropped it (this server is older).
                        setting = SetLevelRequest(params=SetLevelRequestParams(level=level))
                        await client.session.send_request(setting, EmptyResult)
                try:
                    return await _sent(client, name, arguments, max(timeout_s, 0.001), relay)
                except Exception as exc:  # raised once the session is closed (its task group would wrap it)
                    failure = exc
            assert failure is not None  # the call returned, or failed
            raise failure
        except (Unsent, TasksRequired, errors.ToolError):
            raise
        except Exception as exc:
            raise watch.take(spec.name) or mapped(exc, spec.name) from exc

    async def list_tools(self, spec: ServerSpec) -> tuple[str, list[dict[str, Any]]]:
        """The protocol version negotiated and every tool the server lists (every page)."""
        client = await self.client(spec)
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        try:
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return client.protocol_version, tools
        except Exception as exc:
            await self.forget(spec)
            raise mapped(exc, spec.name) from exc
        raise errors.ReceiveFailed(f"The MCP server {spec.name!r} listed more than {MAX_LIST_PAGES} pages of tools.")

    def _challenged(self, spec: ServerSpec) -> errors.ToolError | None:
        held = self._held.get(spec)
        return None if held is None else held.watch.take(spec.name)

    def _alive(self, spec: ServerSpec) -> bool:
        held = self._held.get(spec)
        return held is not None and held.alive

    async def forget(self, spec: ServerSpec) -> None:
        held = self._held.pop(spec, None)
        if held is not None:
            await held.close()

    async def close(self) -> None:
        """End every session (DELETE where the transport has a session id)."""
        held, self._held = list(self._held.values()), {}
        await asyncio.gather(*(h.close() for h in held))
