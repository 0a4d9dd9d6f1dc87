"""A program's run record and its child calls, without Redis: callIds, the parent's identity and deadline,
and what a tool call's envelope becomes inside the program."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from worker.program.runs import Run, answer_of, call_line, child_call, child_id, deadline_of, parent_of
from worker.program.sandbox import ToolRequest
from worker.protocol import ToolCall

STARTED = datetime(2026, 11, 27, 12, 0, tzinfo=UTC).timestamp()


def test_child_ids_name_their_run_and_number() -> None:
    """`<runId>~<n>`; an id without a number after the mark is no child."""
    assert child_id("run-1", 7) == "run-1~7"
    assert parent_of("run-1~7") == "run-1"
    assert parent_of("a~b~12") == "a~b"
    assert parent_of("plain-call") is None and parent_of("x~y") is None


def test_a_child_carries_the_parents_identity_and_deadline() -> None:
    """Principal, tenant, user and the deadline go to every child; header values never do."""
    parent = ToolCall.model_validate(
        {"callId": "p", "tool": "run_code", "tenant": "acme", "principal": "bot", "user": "ada", "headers": {"X": "s"}}
    )
    deadline = datetime(2026, 11, 27, 12, 2, tzinfo=UTC)
    child = child_call(parent, "p~0", ToolRequest(0, "get_item", {"item": "a"}), deadline)
    assert {k: child[k] for k in ("callId", "tool", "arguments", "tenant", "principal", "user", "deadline")} == {
        "callId": "p~0",
        "tool": "get_item",
        "arguments": {"item": "a"},
        "tenant": "acme",
        "principal": "bot",
        "user": "ada",
        "deadline": deadline.isoformat(),
    }
    assert "headers" not in child


def test_the_deadline_is_the_earliest_of_the_programs_limits() -> None:
    """The wall-time limit, the program's own timeoutSeconds and its own deadline: the earliest wins."""
    start = datetime.fromtimestamp(STARTED, UTC)
    plain = ToolCall.model_validate({"callId": "p", "tool": "run_code"})
    assert deadline_of(plain, STARTED, 120) == start + timedelta(seconds=120)
    short = ToolCall.model_validate({"callId": "p", "tool": "run_code", "timeoutSeconds": 30})
    assert deadline_of(short, STARTED, 120) == start + timedelta(seconds=30)
    due = start + timedelta(seconds=10)
    fixed = ToolCall.model_validate({"callId": "p", "tool": "run_code", "deadline": due.isoformat()})
    assert deadline_of(fixed, STARTED, 120) == due


def test_an_envelope_becomes_a_value_or_a_tool_error() -> None:
    """structuredContent when there is one, else the text; a failure's text names tool, exit and status."""
    assert answer_of({"exitCode": 0, "result": "{}", "structuredContent": {"a": 1}}) == {
        "exitCode": 0,
        "value": {"a": 1},
    }
    assert answer_of({"exitCode": 0, "result": "plain"}) == {"exitCode": 0, "value": "plain"}
    failed = {"exitCode": 22, "tool": "t", "statusCode": 404, "error": {"type": "http_error", "message": "gone"}}
    assert answer_of(failed) == {"exitCode": 22, "error": "ToolError: t exit 22 (HTTP 404): gone"}
    line = call_line({**failed, "callId": "p~0", "durationMs": 3.5})
    assert line == {"callId": "p~0", "tool": "t", "exitCode": 22, "durationMs": 3.5}


def test_a_run_record_round_trips_through_its_hash_fields() -> None:
    """What is stored is what is read back (bytes, as the queue's client reads them)."""
    run = Run("r", "waiting", {"callId": "r"}, STARTED, ["t"], b"\x00state", {3: "r~0"}, {"r~0": "t"}, 1, "hi\n")
    raw = {k.encode(): (v if isinstance(v, bytes) else str(v).encode()) for k, v in run.fields().items()}
    assert Run.parsed("r", raw) == run
    assert Run.parsed("r", {}) is None
