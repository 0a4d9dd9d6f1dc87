"""How a call message ends in Celery's eyes: failed, with the first failure named, when any of its calls failed."""

from __future__ import annotations

from typing import Any

from worker.queue.outcome import CallFailed, failure


def summary(tool: str, exit_code: int, error_type: str | None = None) -> dict[str, Any]:
    error = {"type": error_type, "message": f"{tool} went wrong"} if error_type else None
    return {"callId": f"id-{tool}", "tool": tool, "exitCode": exit_code, "error": error}


def test_a_message_whose_calls_all_succeeded_is_no_failure() -> None:
    """One call or a batch, every exit code 0: nothing to report (and what is not a summary is skipped)."""
    assert failure(summary("a", 0)) is None
    assert failure([summary("a", 0), summary("b", 0), "not a summary"]) is None


def test_one_failed_call_names_its_tool_exit_code_and_error() -> None:
    """A single call's failure reads as `tool: exit N type: message`."""
    failed = failure(summary("lookup", 22, "http_error"))
    assert isinstance(failed, CallFailed)
    assert str(failed) == "lookup: exit 22 http_error: lookup went wrong"


def test_a_batch_counts_its_failures_and_names_the_first() -> None:
    """A batch says how many of its calls failed, then the first failure."""
    failed = failure([summary("a", 0), summary("b", 28, "timeout"), summary("c", 64, "unknown_tool")])
    assert str(failed) == "2 of 3 calls failed; the first, b: exit 28 timeout: b went wrong"
