"""JSON that stays JSON when cut: a parsed body made to fit a number of characters, structurally.

The biggest member is cut first (an array keeps the leading items that fit whole, a string keeps its head
and a marker), then the next biggest, until the value fits; what was cut is said in notes such as
"kept 50 of 500 items at $.data". No marker goes inside an array: the note goes in the envelope.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# A string cut short ends with this (and the length it had), or where that does not fit, with the short one.
STRING_MARKER = "…[cut from "
SHORT_MARKER = "…"
# The shortest a string is cut to (shorter ones are left whole and something else is cut).
_MIN_STRING_CHARS = 16
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# One encoder for every length measured (json.dumps with options builds a new one per call).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(value: Any) -> str:
    """The compact JSON text of a value (how a cut value is written in `result`)."""
    return _ENCODER.encode(value)


@dataclass
class Cut:
    """A value cut to fit, and what was cut."""

    value: Any
    notes: list[str] = field(default_factory=list)

    @property
    def note(self) -> str:
        return "; ".join(self.notes)


def fit(value: Any, limit_chars: int) -> Cut:
    """`value` cut so that its compact JSON text is at most `limit_chars` long (as near as whole items allow)."""
    cut = Cut(value)
    cut.value = _fit(value, limit_chars, "$", cut.notes)
    return cut


def _fit(value: Any, budget: int, path: str, notes: list[str], size: int | None = None) -> Any:
    """`value` cut to `budget` characters; `size`: its compact JSON length, when already known."""
    if size is None:
        size = len(dumps(value))
    if size <= budget:
        return value
    if isinstance(value, str):
        return _cut_string(value, budget, path, notes)
    if isinstance(value, list):
        return _cut_list(value, budget, path, notes)
    if isinstance(value, dict):
        return _cut_dict(value, budget, path, notes)
    return value  # a number, true, false, null: nothing to cut


def _cut_string(text: str, budget: int, path: str, notes: list[str]) -> str:
    """The head of the string that fits, and the marker (its short form where the long one does not fit)."""
    for marker in (f"{STRING_MARKER}{len(text)} characters]", SHORT_MARKER):
        keep = budget - len(dumps(marker))
        if keep >= _MIN_STRING_CHARS or marker == SHORT_MARKER:
            keep = max(keep, 0)
            while keep > 0 and len(dumps(text[:keep] + marker)) > budget:  # escapes take more than a character
                keep -= max(1, (len(dumps(text[:keep] + marker)) - budget) // 2)
            break
    notes.append(f"cut the string at {path} to {keep} of {len(text)} characters")
    return text[:keep] + marker


def _cut_list(items: list[Any], budget: int, path: str, notes: list[str]) -> list[Any]:
    kept: list[Any] = []
    used = 2  # the brackets
    for item in items:
        size = len(dumps(item)) + (1 if kept else 0)
        if used + size > budget:
            break
        kept.append(item)
        used += size
    if not kept and items:  # not even the first item fits whole: it is cut in turn
        kept = [_fit(items[0], budget - 2, f"{path}[0]", notes)]
    notes.append(f"kept {len(kept)} of {len(items)} items at {path}")
    return kept


def _cut_dict(members: dict[str, Any], budget: int, path: str, notes: list[str]) -> dict[str, Any]:
    out = dict(members)
    # Each member's length as `"key":value`, and the object's (braces and commas), kept up to date as it shrinks.
    keys = {key: len(dumps(key)) + 1 for key in out}
    sizes = {key: len(dumps(value)) for key, value in out.items()}
    total = 1 + sum(keys[key] + sizes[key] + 1 for key in out)
    for key in sorted(sizes, key=sizes.__getitem__, reverse=True):
        excess = total - budget
        if excess <= 0:
            return out
        if isinstance(out[key], str | list | dict):
            cut = _fit(out[key], max(sizes[key] - excess, 2), _member_path(path, key), notes, sizes[key])
            out[key], total = cut, total - sizes[key] + len(dumps(cut))
            sizes[key] = len(dumps(cut))
    if total > budget:  # many small members: the last ones go
        count = len(out)
        while out and total > budget:
            key, _ = out.popitem()
            total -= keys[key] + sizes[key] + 1
        notes.append(f"kept {len(out)} of {count} members at {path}")
    return out


def _member_path(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENTIFIER.match(key) else f"{path}[{json.dumps(key, ensure_ascii=False)}]"
