"""The handler of an MCP upstream's tools: `tools/call` on the server's session (worker/mcp_client/), in the
call's turn at its upstream, within the call's deadline (past it the SDK sends `notifications/cancelled`).
A tool that runs as a task on its server is called, polled and cancelled by mcp_task.py.

    answer ─▶ turn ─▶ server_spec (URL, headers, credential) ─▶ attempts ─▶ sessions.call_tool ─▶ Answer

A failed attempt is made again, under the upstream's `retry:` (attempts, backoff), only when the request
provably never left (no session could be opened), or when the tool says a repeat is harmless
(`readOnlyHint` or `idempotentHint`) and the failure is a transport's; otherwise the failure is the answer.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from mcp.types import CallToolResult

from worker import errors, logs, metrics
from worker.call.admission import Turn
from worker.call.job import Answer, Job
from worker.call.mcp_authorization import step_up
from worker.call.mcp_server import server_spec
from worker.call.mcp_task import runs_as_task, task_answer
from worker.call.relay import CallEvents
from worker.call.retries import backoff_s
from worker.call.runtime import Runtime
from worker.http.transport import PreparedRequest
from worker.mcp_client.challenges import Challenged
from worker.mcp_client.failures import Unsent
from worker.mcp_client.relay import CallRelay
from worker.mcp_client.spec import ServerSpec
from worker.mcp_client.tasks import TasksRequired


class McpTool:
    """Sends the call to the MCP server its tool was listed by, under the server's own name for it."""

    async def answer(self, job: Job, runtime: Runtime) -> Answer:
        request: PreparedRequest | None = None
        attempts = 0
        relay = relay_of(job, runtime)
        try:
            async with Turn(runtime.turns(job.upstream), job.upstream, job.deadline, job.call.tenant) as turn:
                spec, request = await server_spec(
                    job.upstream,
                    job.call,
                    runtime.environ,
                    runtime.tokens,
                    job.deadline,
                    runtime.transport,
                    runtime.users,
                    runtime.mcp_authorization,
                )
                request = described(request, job)
                logs.bind_secrets(request.secrets)
                with metrics.in_flight(job.tool.name, job.upstream.name):
                    while True:
                        attempts += 1
                        try:
                            result = await _attempt(job, runtime, spec, turn, relay)
                            break
                        except (Unsent, errors.ToolError) as exc:
                            error = exc.error if isinstance(exc, Unsent) else exc
                            if isinstance(error, Challenged):  # never sent again: a step-up, or the refusal
                                raise await step_up(runtime.users, job.call.user, job.upstream, error) from exc
                            wait_s = _retry_wait_s(job, exc, attempts)
                            if wait_s is None:
                                raise error from exc
                        await turn.pause(wait_s)
        except errors.ToolError as exc:
            return Answer(request, attempts=attempts, error=exc, note=_note(relay))
        if relay.visit_url is not None:  # the upstream wanted its page visited: the caller is told where
            return Answer(request, attempts=attempts, error=_visit(job, relay.visit_url), note=_note(relay))
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return Answer(request, attempts=attempts, mcp=dumped, note=_note(relay))


async def _attempt(job: Job, runtime: Runtime, spec: ServerSpec, turn: Turn, relay: CallRelay) -> CallToolResult:
    try:
        if runs_as_task(job):
            return await task_answer(job, runtime, spec, remote_name(job), turn.pause, relay)
        if time.time() >= job.deadline:
            raise errors.DeadlineExceeded("The call ran out of time before the MCP server could answer it.")
        try:
            return await runtime.mcp.call_tool(spec, remote_name(job), job.arguments, job.deadline - time.time(), relay)
        except TasksRequired:  # refused unread: the tool runs only as a task (mcp_task.py)
            return await task_answer(job, runtime, spec, remote_name(job), turn.pause, relay)
    finally:
        await relay.flush()  # what the upstream sent during the call, written before its result


def relay_of(job: Job, runtime: Runtime) -> CallRelay:
    """Where what the upstream sends during the call goes: to the caller through Redis when it listens."""
    wants = job.call.relay
    if wants is None or runtime.queue is None:
        return CallRelay()
    return CallRelay(CallEvents(runtime.queue, job.call.call_id, job.deadline), wants)


def _note(relay: CallRelay) -> str | None:
    return " ".join(relay.notes) or None


def _visit(job: Job, url: str) -> errors.ToolError:
    return errors.AuthorizationRequired(
        f"The MCP server behind {job.tool.name} asks that this page be visited first: {url} (then call again)."
    )


def _retry_wait_s(job: Job, failure: Exception, attempts: int) -> float | None:
    """How long to wait before the next attempt; None: no further attempt."""
    policy = job.upstream.retry
    hints = job.tool.annotations or {}
    harmless = bool(hints.get("readOnlyHint") or hints.get("idempotentHint"))
    unsent = isinstance(failure, Unsent)
    retryable = unsent or (harmless and isinstance(failure, errors.TransportError) and failure.retryable)
    wait_s = backoff_s(policy.backoff_s, policy.max_backoff_s, attempts)
    if not retryable or attempts >= policy.attempts or time.time() + wait_s >= job.deadline:
        return None
    return wait_s


def remote_name(job: Job) -> str:
    return job.tool.remote_name or job.tool.name


def described(request: PreparedRequest, job: Job) -> PreparedRequest:
    """The request as the envelope describes it: the `tools/call` it carries."""
    params: dict[str, Any] = {"name": remote_name(job), "arguments": job.arguments}
    body = json.dumps({"method": "tools/call", "params": params}, ensure_ascii=False).encode()
    return replace(request, body=body)
