"""The wire format: the call object, Celery protocol 2 messages as kombu's Redis transport stores them
(written one call a message or in batches, read, and rewritten without a withdrawn call), and result
metas.

Anything that can LPUSH a JSON string onto a Redis list can enqueue a call; docs/guides/clients.md shows it.
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Literal

from kombu.utils import json as kombu_json
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator

from worker import json_text
from worker.constants import (
    CALLS_HEADER,
    DEFAULT_TENANT,
    ENQUEUED_HEADER,
    MAX_CALL_TIMEOUT_S,
    REDACTED,
    TASK_EXECUTE,
    TASK_EXECUTE_BATCH,
    TENANT_PATTERN,
)
from worker.errors import InvalidArguments
from worker.tracing import MAX_TRACEPARENT_CHARS, MAX_TRACESTATE_CHARS

_ARGSREPR_MAX = 1024
# A batch message is cut at this many bytes of calls. On the wire its body is escaped once more (a JSON
# text inside the message's JSON), and the workers refuse a message over TOOLWORKER_MAX_MESSAGE_BYTES
# (8 MiB by default): a batch of calls near the 1 MiB arguments cap must not be one message.
MAX_BATCH_BYTES = 1024 * 1024
MAX_REPLY_TO_CHARS = 512
MAX_CALLBACK_URL_CHARS = 2048


class Callback(BaseModel):
    """Where the call's envelope is POSTed once published (worker/queue/webhooks.py)."""

    model_config = ConfigDict(extra="ignore")

    url: str = Field(min_length=1, max_length=MAX_CALLBACK_URL_CHARS)


LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
# What an MCP upstream sends during a call, for the caller listening (worker/call/relay.py writes, the gateway's
# worker/gateway/mcp/relay.py reads): a capped stream of the call's events, and the caller's answers to its
# requests, one list each.
CALL_EVENTS_PREFIX = "toolworker:call-events:"
CALL_ANSWER_PREFIX = "toolworker:call-answer:"


def call_events_key(call_id: str) -> str:
    return CALL_EVENTS_PREFIX + call_id


def call_answer_key(call_id: str, request_id: str) -> str:
    return f"{CALL_ANSWER_PREFIX}{call_id}:{request_id}"


class Relay(BaseModel):
    """What the caller of an MCP upstream's tool listens for during the call (the gateway says, for an MCP
    caller): progress, log messages at or above a level, and the requests it can answer (elicitation in
    these modes, sampling). Never a credential."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    progress: bool = False
    log_level: LogLevel | None = Field(None, alias="logLevel")
    elicitation: list[Literal["form", "url"]] = Field(default_factory=list, max_length=2)
    sampling: bool = False


class ToolCall(BaseModel):
    """The call object of a task message (docs/guides/clients.md), validated at the queue."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    call_id: str = Field(alias="callId", min_length=1, max_length=256)
    tool: str = Field(min_length=1, max_length=256)
    # Factories, not `{}`: pydantic deep-copies a mutable default for every message that leaves it out.
    arguments: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    # The headers sealed with the vault's keys (worker/sealing.py), in place of `headers`: opened only by the
    # worker that sends the call (worker/call/call_headers.py), so parked and queued calls keep them sealed.
    sealed_headers: str | None = Field(None, alias="sealedHeaders", min_length=1, max_length=1024 * 1024)
    session_id: str | None = Field(None, alias="sessionId")
    timeout_s: float | None = Field(None, alias="timeoutSeconds", gt=0, le=MAX_CALL_TIMEOUT_S)
    deadline: datetime | None = None
    reply_to: str | None = Field(None, alias="replyTo", min_length=1, max_length=MAX_REPLY_TO_CHARS)
    # W3C trace context of the producer's span, and when the message was enqueued (worker/tracing.py).
    traceparent: str | None = Field(None, max_length=MAX_TRACEPARENT_CHARS)
    tracestate: str | None = Field(None, max_length=MAX_TRACESTATE_CHARS)
    enqueued_at: datetime | None = Field(None, alias="enqueuedAt")
    # Who the call is for (fair share, limits) and, for calls taken by the gateway, who made it: a
    # principal's name, never its credential.
    tenant: str = Field(DEFAULT_TENANT, pattern=TENANT_PATTERN)
    principal: str | None = Field(None, min_length=1, max_length=256)
    # Whom the call acts for: the vault's token set of this user is used for `oauth2_user` upstreams (the
    # gateway sets its principal; a producer names it, trusted like the rest of the message).
    user: str | None = Field(None, min_length=1, max_length=256)
    callback: Callback | None = None
    # Set by the gateway for an MCP caller: what of the upstream's messages during the call it listens for.
    relay: Relay | None = None

    @field_validator("traceparent", "tracestate", "enqueued_at", "relay", mode="wrap")
    @classmethod
    def _never_fatal(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Tracing fields (and a relay) that do not parse are dropped: a call never fails for its trace context,
        nor for what its caller listens for."""
        try:
            return handler(value)
        except ValidationError:
            return None


def parse_call(message: Any, task_id: str) -> ToolCall:
    """Validate a queue message; callId defaults to the Celery task id."""
    if not isinstance(message, dict):
        raise InvalidArguments("The tool call must be a JSON object with at least a `tool` field.")
    try:
        return ToolCall.model_validate({"callId": task_id, **message})
    except ValidationError as exc:
        problems = "; ".join(f"`{'.'.join(map(str, e['loc']))}`: {e['msg']}" for e in exc.errors()[:5])
        raise InvalidArguments(f"The tool call message is invalid: {problems}.") from None


def reply_stream(message: Any) -> str | None:
    """The replyTo of a message that is not a valid call, when it names one a valid call could."""
    reply_to = message.get("replyTo") if isinstance(message, dict) else None
    return reply_to if isinstance(reply_to, str) and 0 < len(reply_to) <= MAX_REPLY_TO_CHARS else None


_ORIGIN = f"toolworker@{socket.gethostname()}"


def redacted_repr(message: Any) -> str:
    """What Flower and task events show of a call: header values hidden, length capped."""
    text = _repr(message, _ARGSREPR_MAX + 1)
    return text if len(text) <= _ARGSREPR_MAX else text[: _ARGSREPR_MAX - 3] + "..."


def _repr(message: Any, room: int) -> str:
    """The repr, or any text of at least `room` characters that begins with it (a batch's calls past
    the cap are never encoded)."""
    if isinstance(message, list):
        parts: list[str] = []
        length = 1  # of the text so far
        for item in message:
            if length >= room:
                break
            separator = 2 if parts else 0
            parts.append(_repr(item, room - length - separator))
            length += separator + len(parts[-1])
        return "[" + ", ".join(parts) + ("]" if len(parts) == len(message) else "")
    if isinstance(message, dict) and isinstance(message.get("headers"), dict):
        message = {**message, "headers": dict.fromkeys(message["headers"], REDACTED)}
    if isinstance(message, dict) and isinstance(message.get("callback"), dict):
        # A callback URL's path and query may carry the receiver's token: its origin only.
        message = {**message, "callback": {"url": url_origin(message["callback"].get("url"))}}
    try:
        return json.dumps(message, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        return "<unrepresentable>"


_URL_ORIGIN = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(?:[^/?#@]*@)?([^/?#]*)")


def url_origin(url: Any) -> str:
    """scheme://host[:port] of a URL, its credentials and everything after the host hidden."""
    match = _URL_ORIGIN.match(url) if isinstance(url, str) else None
    return REDACTED if match is None else f"{match[1]}://{match[2]}/{REDACTED}"


def task_message(task_id: str, args: list[Any], queue: str, task: str = TASK_EXECUTE) -> str:
    """A Celery protocol 2 message, JSON body, as a string to LPUSH onto the queue's list; its CALLS_HEADER
    says how many calls it carries (the fair take counts calls), its ENQUEUED_HEADER when it was made."""
    batch = task == TASK_EXECUTE_BATCH and bool(args) and isinstance(args[0], list)
    body = json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    return json.dumps(
        {
            "body": body,
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": task,
                "id": task_id,
                "root_id": task_id,
                "parent_id": None,
                "group": None,
                "retries": 0,
                "eta": None,
                "expires": None,
                "timelimit": [None, None],
                "argsrepr": redacted_repr(args),
                "kwargsrepr": "{}",
                "origin": _ORIGIN,
                "ignore_result": True,
                CALLS_HEADER: len(args[0]) if batch else 1,
                ENQUEUED_HEADER: int(time.time() * 1000),
            },
            "properties": {
                "correlation_id": task_id,
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def task_messages(calls: list[dict[str, Any]], queue: str, max_batch: int) -> list[str]:
    """Celery messages for these calls: one execute message for a lone call, else batches of at most
    max_batch calls and MAX_BATCH_BYTES."""
    bodies = []
    for chunk in _batches(calls, max_batch):
        if len(chunk) == 1:
            bodies.append(task_message(chunk[0]["callId"], [chunk[0]], queue, TASK_EXECUTE))
        else:
            bodies.append(task_message(str(uuid.uuid4()), [chunk], queue, TASK_EXECUTE_BATCH))
    return bodies


def _batches(calls: list[dict[str, Any]], max_batch: int) -> Iterator[list[dict[str, Any]]]:
    """The calls in order, cut into runs of at most max_batch calls and MAX_BATCH_BYTES (a call larger
    than that alone is a run of its own)."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for call in calls:
        call_bytes = len(json.dumps(call, ensure_ascii=False).encode())
        if chunk and (len(chunk) == max_batch or size + call_bytes > MAX_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(call)
        size += call_bytes
    if chunk:
        yield chunk


def kombu_loads(text: str | bytes) -> Any:
    """kombu's JSON decoding (kombu.utils.json.loads), without its hook where it would do nothing.

    The hook turns each object whose keys are exactly `__type__` and `__value__` into the type it names; it
    costs a Python call per object. An object can have such a key only where the text spells `"__type__"`,
    or writes it with a \\u escape, so a text with neither decodes the same without the hook."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if "__type__" in text or "\\u" in text:
        return kombu_json.loads(text)  # type: ignore[no-untyped-call]  # kombu is unannotated
    return json.loads(text)


def call_id_needle(call_id: str) -> bytes:
    """The bytes a stored message holds where its body names this callId: the call sits in the body, a
    JSON text inside the message's JSON, so escaped twice."""
    return json.dumps(json.dumps(call_id)[1:-1])[1:-1].encode()


def without_call(raw: bytes, call_id: str) -> tuple[bool, str | None]:
    """Whether the message holds the call, and the message without it (None: nothing would be left)."""
    try:
        message = json.loads(raw)
        body = json.loads(message["body"])
        task = message["headers"]["task"]
    except (ValueError, KeyError, TypeError):
        return False, None
    if task == TASK_EXECUTE:
        call = body[0][0] if body and body[0] else None
        return isinstance(call, dict) and call.get("callId") == call_id, None
    if task != TASK_EXECUTE_BATCH or not body or not body[0] or not isinstance(body[0][0], list):
        return False, None
    calls: list[Any] = body[0][0]
    kept = [c for c in calls if not (isinstance(c, dict) and c.get("callId") == call_id)]
    if len(kept) == len(calls):
        return False, None
    if not kept:
        return True, None
    body[0][0] = kept
    message["body"] = json.dumps(body)
    message["headers"]["argsrepr"] = redacted_repr([kept])
    message["headers"][CALLS_HEADER] = len(kept)  # what the fair take counts
    return True, json.dumps(message)


def result_meta(call_id: str, envelope_json: str) -> str:
    """The result as Celery's Redis backend stores it, so `AsyncResult(callId).get()` works too; the
    envelope goes in already serialized (it is published as it is, too)."""
    date_done = datetime.now(UTC).isoformat()  # digits, a T, colons, a dot and a plus: no escape needed
    return (
        f'{{"status":"SUCCESS","result":{envelope_json},"traceback":null,"children":[],'
        f'"date_done":"{date_done}","task_id":{json_text.dumps(call_id)}}}'
    )


def envelope_from_meta(raw: bytes | str) -> dict[str, Any] | None:
    """The envelope inside a stored result, or None for a state that is not final."""
    meta = json.loads(raw)
    if meta.get("status") != "SUCCESS" or not isinstance(meta.get("result"), dict):
        return None
    envelope: dict[str, Any] = meta["result"]
    return envelope
