"""Messages that are not calls at all: recorded in a dead-letter list, and answered when they can be.

The list holds two kinds of entry: `kind: "message"`, written here, and `kind: "webhook"`, a delivery
given up (written by worker/queue/webhooks.py in the script that gives it up, with what a replay needs).

What a dead letter keeps of a message: its size and SHA-256 always; of a transport message (a JSON object
with Celery's fields) its redacted form too, the body decoded and every `headers` value hidden; nothing
of an item that is not one (not JSON, a JSON array, string or null: it may be anything, a secret
included), nor of one over TOOLWORKER_MAX_MESSAGE_BYTES, which is never decoded at all.

Each record has a stable `id` (records written before it had one are named by their digest, see
dead_letter_store.py), and, when the message held calls, `calls`: each call's tool, arguments, callId,
tenant and principal, and its header names (never their values), for an operator to replay it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
import uuid
from typing import Any

import redis
import structlog

from worker.connections import sync_client
from worker.constants import DEAD_LETTER_KEY, DEAD_LETTER_MAX, REDACTED, TASK_EXECUTE_BATCH
from worker.envelope import ToolResult
from worker.errors import InvalidArguments
from worker.loop import process_loop
from worker.protocol import redacted_repr, reply_stream
from worker.settings import get_settings

log = structlog.get_logger("toolworker.dead_letter")
_REPLY_TO = re.compile(r'"replyTo"\s*:\s*"([^"\\]{1,512})"')
# In a message too large to decode, the task id (headers.id) and the replyTo (inside the body, a JSON text
# within the JSON, so its quotes escaped) are looked for in its first and last few KiB only.
_TASK_ID_IN_MESSAGE = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')
_REPLY_TO_IN_BODY = re.compile(rb'\\"replyTo\\"\s*:\s*\\"([^"\\]{1,512})\\"')
_OVERSIZE_SCAN_BYTES = 4096
# What a dead letter keeps of each call it holds, to replay it (headers: their names only).
_REPLAYED_FIELDS = ("callId", "tool", "arguments", "tenant", "principal", "timeoutSeconds", "replyTo")
_SHOWN_DEPTH = 32
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
            url = get_settings().queue_url  # the shard the item was found on
            client = sync_client(url, socket_timeout=_REDIS_TIMEOUT_S, socket_connect_timeout=_REDIS_TIMEOUT_S)
            _client = (os.getpid(), client)
        return _client[1]


def dead_letter(reason: str, exc: Exception | None, body: Any) -> None:
    """Record a rejected message; its content only in redacted form (it may carry call headers)."""
    raw = body if isinstance(body, bytes | str) else json.dumps(body, default=str)
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        decoded = json.loads(data)
    except (ValueError, RecursionError):
        _record(reason, exc, data, None)  # not JSON (or too deeply nested to read): its size and digest only
        return
    _record(reason, exc, data, redacted_repr(_hidden(decoded)), replayable(decoded))


def refuse_item(reason: str, item: bytes, payload: Any) -> None:
    """Record a queue item that is not a transport message (`payload`: the item decoded, None if it is not
    JSON) and answer the calls it names (65), when it is an object whose body can be read."""
    view = _transport_view(payload) if isinstance(payload, dict) else None
    if view is None:
        _record(reason, None, item, None)
        return
    _record(reason, None, item, redacted_repr(_hidden(view)), replayable(view.get("body")))
    error = InvalidArguments("The tool call message is not a Celery message (no `properties` or `headers`).")
    for call_id, reply_to in _named_calls(view):
        _answer(call_id, reply_to, error)


def refuse_oversize(item: bytes, limit_bytes: int) -> None:
    """Record a message over the size limit, undecoded (its size and digest only), and answer it (65) when
    its first or last few KiB name its task id."""
    _record(f"message over {limit_bytes} bytes", None, item, None)
    ends = item[:_OVERSIZE_SCAN_BYTES] + b" " + item[-_OVERSIZE_SCAN_BYTES:]
    task_ids = set(_TASK_ID_IN_MESSAGE.findall(ends))
    if len(task_ids) == 1:
        reply_to = set(_REPLY_TO_IN_BODY.findall(ends)) | set(re.findall(_REPLY_TO.pattern.encode(), ends))
        stream = reply_to.pop().decode("utf-8", "replace") if len(reply_to) == 1 else None
        message = f"The tool call message is too large ({len(item)} bytes; at most {limit_bytes})."
        _answer(task_ids.pop().decode("utf-8", "replace"), stream, InvalidArguments(message))


def _record(
    reason: str, exc: Exception | None, data: bytes, shown: str | None, calls: list[dict[str, Any]] | None = None
) -> None:
    entry: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "kind": "message",
        "reason": reason,
        "error": str(exc)[:500] if exc else None,
        "body": shown,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "at": time.time(),
    }
    if calls:
        entry["calls"] = calls
    log.warning("message.dead_lettered", reason=reason, sha256=entry["sha256"])
    try:
        text = json.dumps(entry, default=str)
    except (ValueError, RecursionError):  # arguments nested past what JSON writes: kept without its calls
        text = json.dumps({**entry, "calls": None})
    try:
        with _redis().pipeline() as pipe:
            pipe.lpush(DEAD_LETTER_KEY, text)
            pipe.ltrim(DEAD_LETTER_KEY, 0, DEAD_LETTER_MAX - 1)
            pipe.execute()
    except redis.RedisError as error:
        log.error("message.dead_letter_failed", error=str(error))


def _hidden(value: Any, depth: int = 0) -> Any:
    """`value` with the values of every `headers` object (and callback URL) hidden, however deep (a message's
    own headers, and each call's in its body); what lies deeper than a record shows is cut."""
    if depth > _SHOWN_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {key: _hidden_item(key, item, depth) for key, item in value.items()}
    if isinstance(value, list):
        return [_hidden(item, depth + 1) for item in value]
    return value


def replayable(body: Any) -> list[dict[str, Any]]:
    """The calls a Celery body (`[args, kwargs, embed]`) holds, as a replay needs them: header names only."""
    if not (isinstance(body, list) and body and isinstance(body[0], list) and body[0]):
        return []
    first = body[0][0]
    calls = first if isinstance(first, list) else [first]
    return [_replayable_call(call) for call in calls if isinstance(call, dict) and isinstance(call.get("tool"), str)]


def _replayable_call(call: dict[str, Any]) -> dict[str, Any]:
    kept = {key: call[key] for key in _REPLAYED_FIELDS if key in call}
    headers = call.get("headers")
    kept["headerNames"] = sorted(map(str, headers)) if isinstance(headers, dict) else []
    return kept


def _hidden_item(key: str, item: Any, depth: int) -> Any:
    """Header values, and a callback's URL (its path or query may hold the receiver's token), hidden."""
    if key == "headers" and isinstance(item, dict):
        return dict.fromkeys(item, REDACTED)
    if key == "callback" and isinstance(item, dict):
        return {"url": REDACTED}
    return _hidden(item, depth + 1)


def _transport_view(payload: dict[str, Any]) -> dict[str, Any]:
    """The message with its body decoded, when it can be; a body that cannot is replaced by its length."""
    body = payload.get("body")
    if not isinstance(body, str):
        return payload
    try:
        text = base64.b64decode(body, validate=True) if _base64(payload) else body
        decoded = json.loads(text)
    except (ValueError, RecursionError):
        decoded = f"<{len(body)} characters, not JSON>"
    return {**payload, "body": decoded}


def _base64(payload: dict[str, Any]) -> bool:
    properties = payload.get("properties")
    return isinstance(properties, dict) and properties.get("body_encoding") == "base64"


def _named_calls(view: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(callId, replyTo) of the calls a message's decoded body holds: one for a call, each of a batch."""
    headers, body = view.get("headers"), view.get("body")
    task_id = headers.get("id") if isinstance(headers, dict) else None
    if not (isinstance(body, list) and body and isinstance(body[0], list) and body[0]):
        return [(task_id, None)] if isinstance(task_id, str) and task_id else []
    batch = isinstance(headers, dict) and headers.get("task") == TASK_EXECUTE_BATCH
    if batch and isinstance(body[0][0], list):
        calls = [(call.get("callId"), call) for call in body[0][0] if isinstance(call, dict)]
    else:
        call = body[0][0]
        calls = [(call.get("callId", task_id) if isinstance(call, dict) else task_id, call)]
    return [(call_id, reply_stream(call)) for call_id, call in calls if isinstance(call_id, str) and call_id]


def answer_undecodable(task_id: str, body: Any) -> None:
    """Give a message that names its task id but cannot be decoded its one envelope (65), on the reply
    stream its text names too."""
    error = InvalidArguments("The tool call message could not be decoded (not JSON, or nested too deeply).")
    _answer(task_id, _reply_stream(body), error)


def _answer(call_id: str, reply_to: str | None, error: InvalidArguments) -> None:
    # Imported here: the broker transport imports this module in every process that uses the app (clients,
    # the gateway, `toolworker health`), and only a worker answers; the service would load the call stack.
    from worker.queue.bridge import process_service

    try:
        publisher = process_service().publisher
        envelope = ToolResult.failure(call_id, "?", error)
        process_loop().run(publisher.publish_one(envelope, reply_to), _ANSWER_TIMEOUT_S)
    except Exception as failure:  # the dead-letter entry still records the message
        log.error("message.answer_failed", callId=call_id, error=str(failure))


def _reply_stream(body: Any) -> str | None:
    """The replyTo of a body that cannot be decoded, when its text names exactly one."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    found = _REPLY_TO.findall(text[:_REPLY_TO_SCAN_CHARS])
    return found[0] if len(found) == 1 else None
