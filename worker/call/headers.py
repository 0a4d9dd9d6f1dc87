"""Rules for header names and values that come from a model or a caller (arguments, call headers)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from worker.errors import InvalidArguments

HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
_FORBIDDEN_VALUE = re.compile(r"[\r\n\x00]")
# Never settable by a call: they would change where or how the request is framed.
FRAMING_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer", "keep-alive"}
)
MAX_HEADERS = 64
MAX_HEADER_VALUE_CHARS = 8192


def checked_header_value(name: str, value: str) -> str:
    if _FORBIDDEN_VALUE.search(value):
        raise InvalidArguments(f"The value of header {name!r} may not contain CR, LF or NUL characters.")
    if len(value) > MAX_HEADER_VALUE_CHARS:
        raise InvalidArguments(f"The value of header {name!r} is too long (at most {MAX_HEADER_VALUE_CHARS}).")
    return value


def check_header_count(headers: Mapping[str, Any]) -> None:
    if len(headers) > MAX_HEADERS:
        raise InvalidArguments(f"Too many headers ({len(headers)}; at most {MAX_HEADERS}).")


def checked_header(name: Any, value: Any, what: str = "Header") -> str:
    """The lower-case name of a settable header with a string value; InvalidArguments otherwise."""
    if not isinstance(name, str) or not HEADER_NAME.match(name) or not isinstance(value, str):
        raise InvalidArguments(f"{what} {str(name)[:64]!r} is not a valid header name with a string value.")
    if name.lower() in FRAMING_HEADERS:
        raise InvalidArguments(f"{what} {name!r} may not be set.")
    checked_header_value(name, value)
    return name.lower()
