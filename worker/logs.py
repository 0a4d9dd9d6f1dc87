"""structlog, configured once: one JSON object per line, secrets redacted before rendering."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from contextvars import ContextVar
from functools import lru_cache
from types import MappingProxyType
from typing import Any, TextIO

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


class LineWriter:
    """Where log lines go (standard error, one line each). The lines logged on the process's event loop are
    written together once per turn of the loop, after what the turn runs: a write, a system call, for every
    line cost a call a twentieth of its CPU. A line logged on any other thread is written at once, after
    those the loop holds."""

    def __init__(self) -> None:
        self.stream: TextIO = sys.stderr
        self._lock = threading.Lock()
        self._held: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    def __call__(self, *_: Any) -> LineWriter:  # structlog's logger factory: one writer for every logger
        return self

    def hold_for(self, loop: asyncio.AbstractEventLoop | None, thread: int | None) -> None:
        """Hold the lines this loop's thread logs until the end of its turn (None: write every line at once)."""
        self.flush()
        self._loop, self._loop_thread = loop, thread

    def holds_for(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._loop is loop

    def forked(self) -> None:
        """In a forked child: no loop of its own runs yet, and the parent writes the lines it held (a thread of
        the child could have the parent's loop thread's id)."""
        self._lock = threading.Lock()
        self._held, self._loop, self._loop_thread = [], None, None

    def msg(self, message: str) -> None:
        if threading.get_ident() == self._loop_thread and self._loop is not None:
            with self._lock:
                self._held.append(message)
                first = len(self._held) == 1
            if first:
                self._loop.call_soon(self.flush)
            return
        with self._lock:
            self._write([*self._take(), message])

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg

    def flush(self) -> None:
        with self._lock:
            self._write(self._take())

    def _take(self) -> list[str]:
        held, self._held = self._held, []
        return held

    def _write(self, lines: list[str]) -> None:
        if lines:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()


lines = LineWriter()
atexit.register(lines.flush)
os.register_at_fork(after_in_child=lines.forked)


def configure(log_format: str = "json", level: str = "INFO") -> None:
    lines.stream = sys.stderr
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
        logger_factory=lines,
        cache_logger_on_first_use=True,
    )
