"""The result envelope (docs/concepts/envelope.md): what every call ends with."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from worker import json_text
from worker.errors import ToolError

_CAMEL = {
    "call_id": "callId",
    "status_code": "statusCode",
    "content_type": "contentType",
    "exit_code": "exitCode",
    "duration_ms": "durationMs",
    "structured": "structuredContent",
}
_SNAKE = {camel: snake for snake, camel in _CAMEL.items()}
_UNPAIRED_SURROGATE = re.compile("[\ud800-\udfff]")
# How Python carries a byte that was not UTF-8 (aiohttp decodes header bytes with surrogateescape).
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


def valid_text(text: str) -> str:
    """The text, made valid Unicode (it can then be encoded as UTF-8, and so be published).

    A byte that was not UTF-8 (carried as a surrogate U+DC80-U+DCFF) is read as Latin-1, as RFC 9110
    (section 5.5) says header text historically was: every byte becomes one character, nothing is lost,
    and a Latin-1 reason phrase reads right. Any other unpaired surrogate (from a JSON escape such as
    "\\ud800") stands for no character at all and becomes U+FFFD."""
    if text.isascii():
        return text
    return _UNPAIRED_SURROGATE.sub(_replacement, text)


def _replacement(match: re.Match[str]) -> str:
    code = ord(match.group())
    return chr(code - 0xDC00) if code in _ESCAPED_BYTES else "\ufffd"


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
    # The JSON body parsed (what `result` reads as, cut or not), when it arrived whole and fits the tool's
    # output schema; MCP's structuredContent. None: not JSON, not whole, or not conforming (see `note`).
    structured: Any = None
    # What a cut kept, e.g. "kept 50 of 500 items at $.data" (None: nothing cut, or cut as text).
    truncation: str | None = None
    # Anything else the model should know about this answer (a pagination stopped early, a body that does
    # not match the tool's output schema).
    note: str | None = None
    # Paginated tools: the pages read, and the argument to pass back to continue when more remain.
    pages: int | None = None
    next_cursor: str | None = None
    # Answered from the cache, stored `age` seconds ago.
    cached: bool = False
    age: int | None = None
    # A program's (code mode, worker/program/): what it printed, and one line per tool call it made.
    output: str | None = None
    calls: list[dict[str, Any]] | None = None
    # An MCP upstream's content blocks as the server sent them (text, image, audio, resources).
    content: list[Any] | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        """The camelCase envelope, as published (its dicts copied; every value is plain JSON). The fields of
        answers (structuredContent, truncation, note, pages, next_cursor, cached, age) only where they say
        something: absent reads as None (False for cached)."""
        return {
            _CAMEL.get(name, name): dict(value) if isinstance(value, dict) and name != "structured" else value
            for name in _FIELDS
            for value in (getattr(self, name),)
            if name not in _OPTIONAL or (value is not None and value is not False)  # an age of 0 is said
        }

    def to_json(self) -> str:
        """The envelope as published: JSON whose every text is valid Unicode (see `valid_text`).

        Made valid once, on the whole text: JSON written with non-ASCII text as it is carries a lone surrogate
        as it is, and what `valid_text` puts in its place (U+FFFD, or a character of U+0080-U+00FF) needs no
        escape in JSON. Raises ValueError or TypeError when a field holds something JSON cannot carry."""
        return valid_text(json_text.dumps(self.to_dict()))

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
_OPTIONAL = frozenset(
    {"structured", "truncation", "note", "pages", "next_cursor", "cached", "age", "content", "output", "calls"}
)
_FIELD_SET = frozenset(_FIELDS)
