"""Retry-After (RFC 9110 §10.2.3): delta-seconds and HTTP-dates, as seconds to wait, never negative."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from worker.http.retry_after import parse_retry_after

# Wed, 21 Oct 2015 07:28:00 GMT
NOW = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("  5 ", 5.0),
        ("007", 7.0),
        ("1.5", 1.5),
        ("-3", 0.0),
    ],
)
def test_delta_seconds(value: str, seconds: float) -> None:
    """Delta-seconds are read as they are (a fraction too); a negative value is clamped to 0."""
    assert parse_retry_after(value, NOW) == seconds


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),  # IMF-fixdate
        ("Wednesday, 21-Oct-15 07:29:00 GMT", 60.0),  # obsolete RFC 850 form
        ("Wed Oct 21 07:28:10 2015", 10.0),  # obsolete asctime form, no zone: UTC
        ("Wed, 21 Oct 2015 09:28:05 +0200", 5.0),  # a numeric zone is honoured
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_http_date(value: str, seconds: float) -> None:
    """An HTTP-date gives the seconds from now until it."""
    assert parse_retry_after(value, NOW) == pytest.approx(seconds)


def test_date_in_the_past_is_zero() -> None:
    """A date already past means: retry now."""
    assert parse_retry_after("Tue, 20 Oct 2015 07:28:00 GMT", NOW) == 0.0


@pytest.mark.parametrize(
    "value", [None, "", "   ", "soon", "1e3", "0x10", "١٢", "Wed, 32 Oct 2015 07:28:00 GMT", "nan"]
)
def test_absent_or_unreadable_is_none(value: str | None) -> None:
    """No header, or one that is neither a number nor a date, is None (the caller's own backoff applies)."""
    assert parse_retry_after(value, NOW) is None


def test_huge_delay_is_returned_for_the_caller_to_cap() -> None:
    """A very long delay is returned as it is; the caller caps it by its deadline."""
    assert parse_retry_after("86400", NOW) == 86400.0
