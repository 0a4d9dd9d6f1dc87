"""The `Retry-After` header (RFC 9110 §10.2.3): delta-seconds or an HTTP-date, as seconds to wait."""

from __future__ import annotations

import re
from datetime import UTC
from email.utils import parsedate_to_datetime

# RFC 9110 allows only 1*DIGIT; a sign and a fraction are accepted because servers send them.
_NUMBER = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from `now` (epoch seconds), never negative; None when absent or unreadable.

    Callers cap the result (by their backoff limit and the call's deadline): an upstream may ask for hours.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return max(0.0, float(text))
    return _seconds_until_date(text, now)


def _seconds_until_date(text: str, now: float) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" and obsolete forms without a zone are UTC in HTTP
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)
