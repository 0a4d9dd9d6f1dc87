"""Structured output: whether a parsed answer conforms to its tool's output schema (MCP `outputSchema`).

A client that was given an `outputSchema` rejects a `structuredContent` that does not conform to it, so a
value is structured output only when it does; otherwise it is text, with a note saying why.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from worker.definitions.model import Tool

# Where a mismatch was found and what it is, in at most this many characters (read by the model).
_MISMATCH_CHARS = 200


def mismatch(tool: Tool, value: Any) -> str | None:
    """None when `value` conforms to the tool's output schema (or it has none); else what is wrong."""
    validator = _validator(tool)
    if validator is None or validator.is_valid(value):  # the common case, without collecting errors
        return None
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "$" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in error.absolute_path)
    return f"at {where}: {error.message}"[:_MISMATCH_CHARS]


@lru_cache(maxsize=4096)
def _validator(tool: Tool) -> Draft202012Validator | None:
    """One validator per tool object (a new definitions version makes new ones)."""
    schema = tool.output_schema
    return None if schema is None else Draft202012Validator(schema)
