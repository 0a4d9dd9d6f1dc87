"""A call run as a task on its MCP server (worker/mcp_client/tasks.py): a tool whose `execution.taskSupport` is
`required` (or that its server refused to run inline for want of the tasks extension), or any tool of an
upstream with `mcp: {tasks: true}`.

    record? ──no──▶ tools/call (tasks extension declared) ──▶ a task ──▶ record stored ──┐
       │                                  └─▶ an inline result: the answer              │
       └──yes (this call was given to a worker before, which was lost) ────────────────▶ poll ──▶ answer

Polling: `tasks/get`, the first soon after the start, then each twice as late, up to the server's
`pollIntervalMs`; the call's turn at its upstream is given up between polls, and a `tasks/get` that fails on
the way (a lost connection, a server restarting) is tried at the next turn. Between polls the record is
read: a call cancelled meanwhile (the gateway marked its record) sends `tasks/cancel`, as does a call that
reached its deadline (instead of `notifications/cancelled`: the request is long answered). The server's
status message is copied to the record, where the call's own task shows it. A task waiting for input
(`input_required`, 2026-07-28) has its requests asked of the caller as the call's relay can (declined where it
cannot ask), and the answers sent with `tasks/update`; then polling goes on. A completed task's result is
mapped like a `tools/call` answer; a failed one like a JSON-RPC error; one the server cancelled by itself
is exit 22.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import structlog
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, CallToolResult

from worker import errors
from worker.call.job import Job
from worker.call.runtime import Runtime
from worker.mcp_client import task_records
from worker.mcp_client.failures import Unsent, mapped
from worker.mcp_client.relay import CallRelay
from worker.mcp_client.spec import ServerSpec
from worker.mcp_client.task_records import UpstreamTask
from worker.mcp_client.tasks import TaskState

log = structlog.get_logger("toolworker.mcp")
Pause = Callable[[float], Awaitable[None]]
# The first poll's wait; each later one waits twice as long, up to the server's pollIntervalMs.
FIRST_POLL_S = 0.05
# The ceiling when the server names no interval.
DEFAULT_POLL_S = 1.0
# At most this long for the tasks/cancel of a call past its deadline.
CANCEL_WAIT_S = 5.0


def runs_as_task(job: Job) -> bool:
    """Sent as a task from the start: the tool requires it, or its upstream asks for tasks wherever a tool
    allows them."""
    return job.tool.task == "required" or bool(job.upstream.mcp is not None and job.upstream.mcp.tasks)


async def task_answer(
    job: Job,
    runtime: Runtime,
    spec: ServerSpec,
    name: str,
    pause: Pause = asyncio.sleep,
    relay: CallRelay | None = None,
) -> CallToolResult:
    """The call's result through an upstream task: the one this call started before, else a new one. `pause`
    waits between polls (the call's turn at its upstream gives its place up meanwhile: admission.Turn); what the
    task asks for is asked of the caller through `relay` (declined where it cannot be asked)."""
    relay = relay or CallRelay()
    redis, call_id = runtime.redis, job.call.call_id
    known = await task_records.read(redis, call_id) if redis is not None else None
    if known is not None:
        log.info("mcp.task_resumed", callId=call_id, upstream=spec.name, task=known.task_id)
        if known.session is None:
            return await _polled(job, runtime, spec, known.task_id, None, pause, relay)
        resumed = replace(spec, session=known.session)  # a 2025-11-25 task: polled on the session it is bound to
        try:
            return await _polled(job, runtime, resumed, known.task_id, None, pause, relay)
        finally:
            await runtime.mcp.end_resumed(resumed)
    if time.time() >= job.deadline:
        raise errors.DeadlineExceeded("The call ran out of time before the MCP server could answer it.")
    started = await runtime.mcp.start_task(spec, name, job.arguments, job.deadline - time.time())
    if isinstance(started, CallToolResult):  # the server ran it inline (a tool that allows tasks only)
        return started
    if redis is not None:
        ttl_s = job.deadline - time.time() + task_records.KEEP_AFTER_DEADLINE_S
        session = runtime.mcp.task_session(spec)
        record = UpstreamTask(spec.name, started.task_id, job.tool.name, session=session)
        await task_records.store(redis, call_id, record, ttl_s)
    log.info("mcp.task_started", callId=call_id, upstream=spec.name, task=started.task_id)
    return await _polled(job, runtime, spec, started.task_id, started.poll_interval_ms, pause, relay)


async def _polled(
    job: Job,
    runtime: Runtime,
    spec: ServerSpec,
    task_id: str,
    interval_ms: int | None,
    pause: Pause,
    relay: CallRelay,
) -> CallToolResult:
    redis, call_id = runtime.redis, job.call.call_id
    wait_s, shown = FIRST_POLL_S, None
    answered: set[str] = set()  # the input requests answered, until the task takes the answers
    while True:
        if redis is not None and await task_records.cancelled(redis, call_id):
            await _cancel(runtime, spec, task_id, call_id, "cancelled")
            raise errors.DeadlineExceeded("The call was cancelled; its task on the MCP server was cancelled too.")
        left_s = job.deadline - time.time()
        if left_s <= 0:
            await _cancel(runtime, spec, task_id, call_id, "deadline")
            raise errors.TimedOut(f"The MCP server {spec.name!r} did not finish the task in time; it was cancelled.")
        state = await _state(runtime, spec, task_id, min(left_s, spec.timeout_s))
        if state is not None:
            if state.terminal:
                return _ended(state, spec.name)
            interval_ms = state.poll_interval_ms or interval_ms
            if state.asks_on_result:  # 2025-11-25: its questions come while tasks/result waits for its end
                return await _result(runtime, spec, task_id, call_id, relay, job.deadline)
            if state.status != "input_required":
                answered.clear()  # the answers were taken: a later question may reuse a key
            asked = {key: request for key, request in (state.input_requests or {}).items() if key not in answered}
            if state.status == "input_required" and asked:
                await _answer(runtime, spec, task_id, call_id, relay, asked)
                answered.update(asked)
                wait_s = FIRST_POLL_S
                continue
            if state.status_message and state.status_message != shown and redis is not None:
                shown = state.status_message
                await task_records.set_status(redis, call_id, shown)
        await pause(max(0.0, min(wait_s, job.deadline - time.time())))
        ceiling_s = interval_ms / 1000 if interval_ms and interval_ms > 0 else DEFAULT_POLL_S
        wait_s = min(wait_s * 2, max(ceiling_s, FIRST_POLL_S))


async def _state(runtime: Runtime, spec: ServerSpec, task_id: str, timeout_s: float) -> TaskState | None:
    """The task's state; None when this poll failed on the way (the next one tries again). A JSON-RPC error
    (the server no longer knows the task) ends the call with 22."""
    try:
        return await runtime.mcp.task_state(spec, task_id, timeout_s)
    except Unsent as exc:
        log.info("mcp.task_poll_failed", upstream=spec.name, task=task_id, reason=exc.error.message)
    except errors.TransportError as exc:
        log.info("mcp.task_poll_failed", upstream=spec.name, task=task_id, reason=exc.message)
    except errors.ToolError as exc:  # the server's refusal (an expired task, say): not the arguments' fault
        raise errors.ToolFailed(f"The MCP server {spec.name!r} could not say how its task is: {exc.message}") from exc
    return None


async def _answer(
    runtime: Runtime, spec: ServerSpec, task_id: str, call_id: str, relay: CallRelay, asked: dict[str, Any]
) -> None:
    """The task's input requests asked of the caller (declined where it cannot be asked), the answers sent with
    `tasks/update`. One that cannot be answered (a refused sampling) cancels the task: the call ends with it."""
    try:
        responses = await relay.answer_inputs(asked)
    except MCPError as exc:
        await _cancel(runtime, spec, task_id, call_id, "unanswerable")
        raise mapped(exc, spec.name) from exc
    await runtime.mcp.update_task(spec, task_id, responses, spec.timeout_s)
    log.info("mcp.task_answered", callId=call_id, upstream=spec.name, task=task_id, requests=len(responses))


async def _result(
    runtime: Runtime, spec: ServerSpec, task_id: str, call_id: str, relay: CallRelay, deadline: float
) -> CallToolResult:
    """A 2025-11-25 task waiting for input: `tasks/result` until its end, its questions asked of the caller as it
    waits; past the call's deadline the task is cancelled."""
    log.info("mcp.task_asks", callId=call_id, upstream=spec.name, task=task_id)
    try:
        return await runtime.mcp.task_result(spec, task_id, deadline - time.time(), relay)
    except (Unsent, errors.ToolError):
        if time.time() < deadline:
            raise
    await _cancel(runtime, spec, task_id, call_id, "deadline")
    raise errors.TimedOut(f"The MCP server {spec.name!r} did not finish the task in time; it was cancelled.")


def _ended(state: TaskState, server: str) -> CallToolResult:
    if state.status == "completed":
        return state.call_result()
    if state.status == "failed":
        error = state.error or {}
        code = error.get("code")
        code = code if isinstance(code, int) else INTERNAL_ERROR
        message = str(error.get("message") or state.status_message or "the task failed")
        raise mapped(MCPError(code, message), server)
    reason = state.status_message or "no reason given"
    raise errors.ToolFailed(f"The MCP server {server!r} cancelled the task: {reason}.")


async def _cancel(runtime: Runtime, spec: ServerSpec, task_id: str, call_id: str, why: str) -> None:
    """`tasks/cancel`, once; a failure is logged (the call ends either way)."""
    try:
        await runtime.mcp.cancel_task(spec, task_id, CANCEL_WAIT_S)
        log.info("mcp.task_cancelled", callId=call_id, upstream=spec.name, task=task_id, why=why)
    except (Unsent, errors.ToolError) as exc:
        reason = exc.error.message if isinstance(exc, Unsent) else exc.message
        log.warning("mcp.task_cancel_failed", callId=call_id, upstream=spec.name, task=task_id, reason=reason)
