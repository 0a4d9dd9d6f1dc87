"""Messages that are not calls at all: recorded in a dead-letter list, and answered when they can be."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from typing import Any

import redis
import structlog

from worker.connections import sync_client
from worker.constants import DEAD_LETTER_KEY, DEAD_LETTER_MAX
from worker.envelope import ToolResult
from worker.errors import InvalidArguments
from worker.loop import process_loop
from worker.protocol import redacted_repr
from worker.queue.bridge import process_service
from worker.settings import get_settings

log = structlog.get_logger("toolworker.dead_letter")
_REPLY_TO = re.compile(r'"replyTo"\s*:\s*"([^"\\]{1,512})"')
_REPLY_TO_SCAN_CHARS = 1 << 20
# These run on Celery's consumer thread: a Redis that does not answer may hold it this long at most.
_REDIS_TIMEOUT_S = 2.0
_ANSWER_TIMEOUT_S = 5.0

_client: tuple[int, redis.Redis] | None = None
_client_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client per process (a client per message cost a connection each time)."""
    global _client
    with _client_lock:
        if _client is None or _client[0] != os.getpid():
            url = get_settings().redis_url
            client = sync_client(url, socket_timeout=_REDIS_TIMEOUT_S, socket_connect_timeout=_REDIS_TIMEOUT_S)
            _client = (os.getpid(), client)
        return _client[1]


def dead_letter(reason: str, exc: Exception | None, body: Any) -> None:
    """Record a rejected message; its content only in redacted form (it may carry call headers)."""
    raw = body if isinstance(body, bytes | str) else json.dumps(body, default=str)
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        shown = redacted_repr(json.loads(data))
    except (ValueError, RecursionError):
        shown = None  # not JSON (or too deeply nested to read): keep only its size and digest
    entry = {
        "reason": reason,
        "error": str(exc)[:500] if exc else None,
        "body": shown,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "at": time.time(),
    }
    log.warning("message.dead_lettered", reason=reason, sha256=entry["sha256"])
    try:
        with _redis().pipeline() as pipe:
            pipe.lpush(DEAD_LETTER_KEY, json.dumps(entry))
            pipe.ltrim(DEAD_LETTER_KEY, 0, DEAD_LETTER_MAX - 1)
            pipe.execute()
    except redis.RedisError as error:
        log.error("message.dead_letter_failed", error=str(error))


def answer_undecodable(task_id: str, body: Any) -> None:
    """Give a message that names its task id but cannot be decoded its one envelope (65), on the reply
    stream its text names too."""
    error = InvalidArguments("The tool call message could not be decoded (not JSON, or nested too deeply).")
    try:
        publisher = process_service().publisher
        envelope = ToolResult.failure(task_id, "?", error)
        process_loop().run(publisher.publish_one(envelope, _reply_stream(body)), _ANSWER_TIMEOUT_S)
    except Exception as failure:  # the dead-letter entry still records the message
        log.error("message.answer_failed", callId=task_id, error=str(failure))


def _reply_stream(body: Any) -> str | None:
    """The replyTo of a body that cannot be decoded, when its text names exactly one."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    found = _REPLY_TO.findall(text[:_REPLY_TO_SCAN_CHARS])
    return found[0] if len(found) == 1 else None
