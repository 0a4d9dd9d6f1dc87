"""The structured lines of a worker's or gateway's log (one JSON object each), read as the objects they are:
a test asks for a field's value, not for the spacing the renderer happens to write."""

from __future__ import annotations

import json
from typing import Any


def log_events(text: str) -> list[dict[str, Any]]:
    """Every line of `text` that is a JSON object, parsed (Celery's own lines are left out)."""
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short where the log was read while written
            if isinstance(event, dict):
                events.append(event)
    return events
