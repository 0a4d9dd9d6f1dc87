"""A program's run as Redis holds it between its stretches, and the child calls it sends.

    toolworker:program:<runId>   HASH  state, call (the program's call as its message held it), started,
                                       tools (JSON: what `tools` offers), snapshot (Monty's state at the
                                       last suspension), pending (JSON: Monty's call id -> child callId),
                                       seq (children sent so far), output (printed so far), calls (JSON:
                                       one line per answered child); kept for the result TTL

States: (none) -> waiting (suspended; its children were sent in the same transaction) -> queued (every
child it waits for answered; its message is back on the queue) -> waiting ... A waiting program can be
cancelled: its message goes back on the queue to be answered, its children not started are withdrawn.
A worker lost while running a stretch leaves the state as it was: the message comes back and the stretch
runs again from the stored snapshot, making the same calls with the same callIds, none of them sent yet.

A child's callId is `<runId>~<n>`, n counting the run's calls from 0: the same program resumed from the
same state names its calls the same, on any worker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from worker.program.sandbox import ToolRequest
from worker.protocol import ToolCall

RUN_KEY_PREFIX = "toolworker:program:"
CHILD_MARK = "~"
WAITING, QUEUED, CANCELLED = "waiting", "queued", "cancelled"


def run_key(run_id: str) -> str:
    return RUN_KEY_PREFIX + run_id


def child_id(run_id: str, seq: int) -> str:
    return f"{run_id}{CHILD_MARK}{seq}"


def parent_of(call_id: str) -> str | None:
    """The run a child call belongs to; None for a call whose id is not a child's."""
    run_id, mark, seq = call_id.rpartition(CHILD_MARK)
    return run_id if mark and run_id and seq.isdigit() else None


@dataclass
class Run:
    """A run's record (see the module's docstring)."""

    run_id: str
    state: str = ""
    call: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    tools: list[str] = field(default_factory=list)
    snapshot: bytes = b""
    pending: dict[int, str] = field(default_factory=dict)
    # The tool of each pending child, by callId (a cancel withdraws those not started from their queue).
    tools_of: dict[str, str] = field(default_factory=dict)
    seq: int = 0
    output: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def parsed(cls, run_id: str, raw: Mapping[Any, Any]) -> Run | None:
        """The run as stored (bytes, as the queue's client reads it); None when there is none."""
        if not raw:
            return None
        text: dict[str, bytes] = {k.decode(): v for k, v in raw.items()}
        return cls(
            run_id=run_id,
            state=text.get("state", b"").decode(),
            call=json.loads(text.get("call") or b"{}"),
            started=float(text.get("started") or 0),
            tools=json.loads(text.get("tools") or b"[]"),
            snapshot=text.get("snapshot", b""),
            pending={int(k): v for k, v in json.loads(text.get("pending") or b"{}").items()},
            tools_of=json.loads(text.get("toolsOf") or b"{}"),
            seq=int(text.get("seq") or 0),
            output=(text.get("output") or b"").decode(),
            calls=json.loads(text.get("calls") or b"[]"),
        )

    def fields(self) -> dict[Any, Any]:
        """Everything stored, as the hash's fields."""
        fields: dict[Any, Any] = {
            "state": self.state,
            "call": json.dumps(self.call, ensure_ascii=False),
            "started": repr(self.started),
            "tools": json.dumps(self.tools),
            "snapshot": self.snapshot,
            "pending": json.dumps({str(k): v for k, v in self.pending.items()}),
            "toolsOf": json.dumps(self.tools_of),
            "seq": self.seq,
            "output": self.output,
            "calls": json.dumps(self.calls, ensure_ascii=False),
        }
        return fields


def child_call(parent: ToolCall, call_id: str, request: ToolRequest, deadline: datetime) -> dict[str, Any]:
    """A child call as its message holds it: the parent's principal, tenant, user and deadline."""
    message: dict[str, Any] = {
        "callId": call_id,
        "tool": request.tool,
        "arguments": request.arguments,
        "tenant": parent.tenant,
        "deadline": deadline.isoformat(),
        "enqueuedAt": datetime.now(UTC).isoformat(),
    }
    if parent.principal:
        message["principal"] = parent.principal
    if parent.user:
        message["user"] = parent.user
    if parent.traceparent:
        message["traceparent"] = parent.traceparent
    return message


def deadline_of(parent: ToolCall, started: float, timeout_s: float) -> datetime:
    """When the program must have answered: the earliest of its own deadline, its start plus its own
    timeoutSeconds, and its start plus the wall-time limit (TOOLWORKER_CODE_TIMEOUT_SECONDS)."""
    start = datetime.fromtimestamp(started, UTC)
    limits = [start + timedelta(seconds=timeout_s)]
    if parent.timeout_s is not None:
        limits.append(start + timedelta(seconds=parent.timeout_s))
    if parent.deadline is not None:
        limits.append(parent.deadline if parent.deadline.tzinfo else parent.deadline.replace(tzinfo=UTC))
    return min(limits)


def answer_of(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """What the program's `await tools.x()` receives: the value, or the text its ToolError carries."""
    exit_code = int(envelope.get("exitCode") or 0)
    if exit_code == 0:
        structured = envelope.get("structuredContent")
        return {"exitCode": 0, "value": structured if structured is not None else envelope.get("result", "")}
    error = envelope.get("error") or {}
    status = envelope.get("statusCode")
    http = f" (HTTP {status})" if status else ""
    message = error.get("message") if isinstance(error, dict) else None
    text = f"ToolError: {envelope.get('tool')} exit {exit_code}{http}: {message or envelope.get('result', '')}"
    return {"exitCode": exit_code, "error": text}


def call_line(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """One line of the program's `calls`: the child's callId, tool, exit code and duration."""
    return {
        "callId": envelope.get("callId"),
        "tool": envelope.get("tool"),
        "exitCode": envelope.get("exitCode"),
        "durationMs": envelope.get("durationMs"),
    }
