"""structlog, configured once: one JSON object per line, secrets redacted before rendering."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from contextvars import ContextVar
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import structlog

from worker import json_text
from worker.constants import REDACTED
from worker.redaction import MIN_SECRET_LEN, is_secret_name

# Event keys whose names match the pattern but hold no secret.
_SAFE_KEYS = frozenset({"event", "callId", "sessionId"})
# The secret values of the call being logged (from ${env:...}, secret headers, call headers).
_call_secrets: ContextVar[tuple[str, ...]] = ContextVar("toolworker_call_secrets", default=())
# What names the call being logged (callId, tool, tenant, upstream...): one variable for all of them, so that a
# call binds them in one step and a line merges them without walking the whole context.
_call_fields: ContextVar[Mapping[str, Any]] = ContextVar("toolworker_call_fields", default=MappingProxyType({}))


def bind_call(**fields: Any) -> None:
    """Add these fields to every log line of the current call (the current context: its asyncio task)."""
    _call_fields.set({**_call_fields.get(), **fields})


def merge_call_fields(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The call's fields on the line (a field the line gives itself wins)."""
    for key, value in _call_fields.get().items():
        event.setdefault(key, value)
    return event


def bind_secrets(secrets: Iterable[str]) -> None:
    """Redact these values from every log line of the current call (the current context)."""
    _call_secrets.set(tuple(sorted((s for s in secrets if len(s) >= MIN_SECRET_LEN), key=len, reverse=True)))


def redact_secret_values(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    secrets = _call_secrets.get()
    if secrets:
        for key, value in event.items():
            if isinstance(value, str):
                for secret in secrets:
                    value = value.replace(secret, REDACTED)
                event[key] = value
    return event


def redact_secret_keys(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the values of keys that name a secret, at any depth of mappings."""
    for key, value in event.items():
        if _names_secret(key):
            event[key] = REDACTED
        elif isinstance(value, dict):
            event[key] = redact_secret_keys(None, "", dict(value))
    return event


@lru_cache(maxsize=4096)
def _names_secret(key: Any) -> bool:
    """Every log line asks this of the same few keys: a pattern search each time was a third of its cost."""
    return isinstance(key, str) and key not in _SAFE_KEYS and is_secret_name(key)


def configure(log_format: str = "json", level: str = "INFO") -> None:
    renderer: Any = (
        structlog.processors.JSONRenderer(json_text.dumps, allow_nan=True)
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            merge_call_fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secret_keys,
            structlog.processors.format_exc_info,
            redact_secret_values,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # One write and one flush a line (the print behind PrintLogger costs more for the same bytes).
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
