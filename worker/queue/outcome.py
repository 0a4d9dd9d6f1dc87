"""How a call message ends in Celery's eyes (and so in Flower's): failed when one of its calls failed.

The envelopes are published by the service either way, exactly once per callId; the failure only reaches
task events (Flower's "Failed" view shows the error type and message). Celery stores no result of its own
(`task_ignore_result`), so `AsyncResult(callId).get()` still returns the envelope.
"""

from __future__ import annotations

from typing import Any


class CallFailed(Exception):
    """A call message whose calls did not all succeed (exit code not 0)."""


class PublishFailed(Exception):
    """A call message whose results could not all be published (Redis failed): it must not be
    acknowledged, but handed back to the queue (`worker.queue.bridge` makes it Celery's Reject)."""


def failure(summaries: Any) -> CallFailed | None:
    """The failure to report for a message's summaries (one dict, or a batch's list), None when all succeeded."""
    items = [s for s in (summaries if isinstance(summaries, list) else [summaries]) if isinstance(s, dict)]
    failed = [s for s in items if s.get("exitCode")]
    if not failed:
        return None
    first = failed[0]
    error = first.get("error") or {}
    text = f"{first.get('tool')}: exit {first['exitCode']} {error.get('type')}: {error.get('message')}"
    if len(items) > 1:
        text = f"{len(failed)} of {len(items)} calls failed; the first, {text}"
    return CallFailed(text)
