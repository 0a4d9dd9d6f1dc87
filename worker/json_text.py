"""JSON text written on every call's path (its envelope, its result meta, its log lines): orjson where it can,
the standard library where it cannot.

orjson writes what `json.dumps(value, ensure_ascii=False, separators=(",", ":"))` writes, five times faster,
and refuses what JSON cannot carry as it is: text that is not valid Unicode (a lone surrogate), an integer
past 64 bits, a key that is not a string, nesting past 254 levels. Those few values go to the standard
library, which writes them (or says why not) as before. One difference is kept on purpose: a NaN or an
infinity, which JSON has no word for, is written as `null` rather than refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson


def dumps(value: Any, default: Callable[[Any], Any] | None = None, allow_nan: bool = False) -> str:
    """Compact JSON, non-ASCII text as it is; `default` turns a value JSON has no type for into one it has
    (structlog's renderer passes its own). Raises ValueError or TypeError as `json.dumps` does (`allow_nan`:
    for what only the standard library writes)."""
    try:
        return orjson.dumps(value, default=default).decode()
    except orjson.JSONEncodeError:
        return _standard(value, default, allow_nan)


def utf8(value: Any) -> bytes:
    """`dumps` as UTF-8; UnicodeEncodeError for text that is not valid Unicode."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _standard(value, None, True).encode()


def _standard(value: Any, default: Callable[[Any], Any] | None, allow_nan: bool) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan, default=default)
