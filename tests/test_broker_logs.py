"""What the broker transport lets kombu log: a Redis refusal kombu meets while keeping its bindings alive is one
warning line with the error, not a traceback every few seconds."""

from __future__ import annotations

import logging

import pytest
import redis

from worker.queue import broker


def test_a_refusal_kombu_warns_of_is_one_line_naming_the_error(caplog: pytest.LogCaptureFixture) -> None:
    """The warning keeps its text and gains the error's type and message; no traceback is attached."""
    broker.register()
    logger = logging.getLogger("kombu.transport.redis")
    with caplog.at_level(logging.WARNING, logger="kombu.transport.redis"):
        try:
            raise redis.exceptions.NoPermissionError("User default has no permissions to run the 'evalsha' command")
        except redis.ResponseError:
            logger.warning("maybe_refresh_binding_expiry: Redis error, will retry", exc_info=True)
    (record,) = caplog.records
    assert record.getMessage() == (
        "maybe_refresh_binding_expiry: Redis error, will retry "
        "(NoPermissionError: User default has no permissions to run the 'evalsha' command)"
    )
    assert record.exc_info is None and "Traceback" not in caplog.text


def test_registering_twice_adds_one_filter() -> None:
    """The filter is attached once, however often the transport is registered."""
    broker.register()
    broker.register()
    filters = logging.getLogger("kombu.transport.redis").filters
    assert sum(1 for f in filters if type(f).__name__ == "_OneLineRefusals") == 1


def test_other_lines_pass_as_they_are(caplog: pytest.LogCaptureFixture) -> None:
    """An error line keeps its traceback; a warning without one is unchanged."""
    broker.register()
    logger = logging.getLogger("kombu.transport.redis")
    with caplog.at_level(logging.WARNING, logger="kombu.transport.redis"):
        logger.warning("plain %s", "warning")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("an error", exc_info=True)
    assert [r.getMessage() for r in caplog.records] == ["plain warning", "an error"]
    assert caplog.records[1].exc_info is not None
