"""The result envelope (README, "The result envelope and exit codes"): what every call ends with."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from worker.errors import ToolError

_CAMEL = {
    "call_id": "callId",
    "status_code": "statusCode",
    "content_type": "contentType",
    "exit_code": "exitCode",
    "duration_ms": "durationMs",
}
_SNAKE = {camel: snake for snake, camel in _CAMEL.items()}


@dataclass(slots=True)
class ToolResult:
    call_id: str
    tool: str
    method: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    status_code: int | None = None
    content_type: str | None = None
    result: str = ""
    error: dict[str, str] | None = None
    exit_code: int = 0
    truncated: bool = False
    attempts: int = 0
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        """The camelCase envelope, as published (its dicts copied; every value is plain JSON)."""
        return {
            _CAMEL.get(name, name): dict(value) if isinstance(value, dict) else value
            for name in _FIELDS
            for value in (getattr(self, name),)
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        return cls(**{name: v for k, v in data.items() if (name := _SNAKE.get(k, k)) in _FIELD_SET})

    @classmethod
    def failure(cls, call_id: str, tool: str, error: ToolError, **details: Any) -> ToolResult:
        return cls(
            call_id=call_id,
            tool=tool,
            error={"type": error.type, "message": error.message},
            exit_code=error.exit_code,
            **details,
        )


_FIELDS = tuple(f.name for f in fields(ToolResult))
_FIELD_SET = frozenset(_FIELDS)
