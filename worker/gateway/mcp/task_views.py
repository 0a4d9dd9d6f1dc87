"""A task as each generation's wire shows it: its record with the call's envelope (TaskView), the 2026-07-28
shape (the outcome inline) and the 2025-11-25 one, and the tool result a task answers with (results.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import mcp_types as types

from worker.envelope import ToolResult
from worker.gateway.calls import Calls
from worker.gateway.mcp.relay import last_progress
from worker.gateway.mcp.results import tool_result
from worker.gateway.mcp.task_store import TaskRecord, now_iso

RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"
Generation = Literal["2026", "2025"]
Status = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL = frozenset({"completed", "failed", "cancelled"})


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


async def view_of(calls: Calls, record: TaskRecord) -> TaskView:
    """The task as it stands: a cancelled one has no envelope to read; otherwise the call's, if answered."""
    if record.status == "cancelled":
        return TaskView(record, None)
    envelope = await calls.wait(record.task_id, 0.0)
    if envelope is None and record.status == "working":
        # A call that waits on a task of its MCP server shows that task's latest status message; one whose
        # upstream reports progress, its last progress message.
        message = await calls.upstream_status(record.task_id) or await last_progress(
            calls.client.redis_of(record.tenant), record.task_id
        )
        record = record if not message else record.model_copy(update={"status_message": message})
    return TaskView(record, envelope)


def detailed(view: TaskView) -> dict[str, Any]:
    """A 2026-07-28 task with its outcome inline: the tool result, the input requests, or the error."""
    answer = task_2026(view)
    if view.status == "completed" and view.envelope is not None:
        answer["result"] = task_result(view.envelope, view.record.task_id, "2026")
    elif view.status == "input_required":
        answer["inputRequests"] = view.record.input_requests or {}
    elif view.status == "failed":
        answer["error"] = {"code": types.INTERNAL_ERROR, "message": view.record.status_message or "failed"}
    return answer


def task_2026(view: TaskView) -> dict[str, Any]:
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


def task_2025(view: TaskView) -> dict[str, Any]:
    answer = task_2026(view)
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


def task_result(envelope: ToolResult, task_id: str, generation: Generation) -> dict[str, Any]:
    answer = tool_result(envelope, task_id, 0.0)
    if generation == "2025":
        answer.pop("resultType", None)
        answer["_meta"] = {**answer.get("_meta", {}), RELATED_TASK_META_KEY: {"taskId": task_id}}
    return answer
