"""One tool call, start to envelope: resolve, validate, render, send (with retries), shape the result."""

from __future__ import annotations

import asyncio
import codecs
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

import redis.asyncio as aioredis
import structlog
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaViolation
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from yarl import URL

from worker import errors, logs, metrics
from worker.call import ratelimit
from worker.call.catalog_tools import ALIASES, run_catalog
from worker.call.circuit import Breakers, CircuitBreaker
from worker.call.http_request import render_generic
from worker.call.rendering import PreparedRequest, redact, render
from worker.constants import MAX_ARGUMENTS_BYTES, RATE_LIMIT_KEY_PREFIX
from worker.definitions.model import IDEMPOTENT_METHODS, Tool, ToolSet, Upstream
from worker.envelope import ToolResult
from worker.http.egress import EgressPolicy
from worker.http.retry_after import parse_retry_after
from worker.http.transport import Limits, RedirectCheck, Response, Transport

log = structlog.get_logger("toolworker.call")
_MAX_REPORTED_ERRORS = 5
# A Retry-After longer than this is not waited for (the non-2xx answer is returned).
MAX_RETRY_AFTER_S = 60.0
# A call without a deadline waits this long at most for the shared rate limit.
MAX_RATE_WAIT_S = 300.0
_READ_MARGIN_BYTES = 64 * 1024
# Calls to one upstream under way at once (rendered, sent or being answered), per pooled connection:
# enough that a connection coming free finds its next request ready.
TURNS_PER_CONNECTION = 2


class ToolCall(BaseModel):
    """The job of SPEC §3, validated at the queue boundary."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    call_id: str = Field(alias="callId", min_length=1, max_length=256)
    tool: str = Field(min_length=1, max_length=256)
    # Factories, not `{}`: pydantic deep-copies a mutable default for every message that leaves it out.
    arguments: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    session_id: str | None = Field(None, alias="sessionId")
    timeout_s: float | None = Field(None, alias="timeoutSeconds", gt=0, le=86_400)
    deadline: datetime | None = None
    reply_to: str | None = Field(None, alias="replyTo", min_length=1, max_length=512)


@dataclass
class Runtime:
    """What calls in one worker process share: the tools, the HTTP pools, the environment."""

    toolset: ToolSet
    environ: Mapping[str, str]
    transport: Transport = field(default_factory=Transport)
    policy: EgressPolicy = field(default_factory=lambda: EgressPolicy.parse(""))
    breakers: Breakers = field(default_factory=Breakers)
    # Shared state between workers (rate limits); None where no Redis is at hand (unit tests).
    redis: aioredis.Redis | None = None
    _validators: dict[str, Draft202012Validator] = field(default_factory=dict)
    _turns: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    def resolve(self, name: str) -> tuple[Tool, Upstream]:
        tool = self.toolset.tools.get(ALIASES.get(name, name))
        if tool is None:
            if name in self.toolset.unusable:
                raise errors.ToolMisconfigured(
                    f"The tool {name!r} cannot be used because its definition is broken. Tell the operator."
                )
            raise errors.UnknownTool(f"There is no tool named {name!r}. Use one of the tools you were given.")
        return tool, self.toolset.upstreams[tool.upstream]

    def swap(self, toolset: ToolSet) -> None:
        """Serve a new set of tools from the next call on (calls in flight keep theirs)."""
        self.toolset, self._validators, self._turns = toolset, {}, {}

    def turns(self, upstream: Upstream) -> asyncio.Semaphore:
        """The turns of the calls to one upstream (see `Turn`)."""
        turns = self._turns.get(upstream.name)
        if turns is None:
            turns = self._turns[upstream.name] = asyncio.Semaphore(TURNS_PER_CONNECTION * upstream.max_concurrency)
        return turns

    def validator(self, tool: Tool) -> Draft202012Validator:
        validator = self._validators.get(tool.name)
        if validator is None:
            validator = self._validators[tool.name] = Draft202012Validator(tool.input_schema)
        return validator


def parse_call(message: Any, task_id: str) -> ToolCall:
    """Validate a queue message; callId defaults to the Celery task id."""
    if not isinstance(message, dict):
        raise errors.InvalidArguments("The tool call must be a JSON object with at least a `tool` field.")
    try:
        return ToolCall.model_validate({"callId": task_id, **message})
    except ValidationError as exc:
        problems = "; ".join(f"`{'.'.join(map(str, e['loc']))}`: {e['msg']}" for e in exc.errors()[:5])
        raise errors.InvalidArguments(f"The tool call message is invalid: {problems}.") from None


async def execute(call: ToolCall, runtime: Runtime, received_at: float | None = None) -> ToolResult:
    """Run one call; every outcome, including a bug in the worker, is an envelope."""
    started = time.perf_counter()
    envelope = ToolResult(call_id=call.call_id, tool=call.tool)
    # Each call runs in an asyncio task of its own, so its context (and these bindings) die with it.
    structlog.contextvars.bind_contextvars(callId=call.call_id, tool=call.tool)
    try:
        await _run(call, runtime, envelope, time.time() if received_at is None else received_at)
    except errors.ToolError as exc:
        envelope.error = {"type": exc.type, "message": exc.message}
        envelope.exit_code = exc.exit_code
    except Exception:
        log.exception("call.internal_error")
        envelope.error = {"type": "internal_error", "message": "The worker failed while running this tool."}
        envelope.exit_code = errors.InternalError.exit_code
    envelope.duration_ms = round((time.perf_counter() - started) * 1000, 3)
    metrics.observe_call(envelope, _upstream_name(runtime, call.tool))
    log.info(
        "call.finished",
        exitCode=envelope.exit_code,
        statusCode=envelope.status_code,
        attempts=envelope.attempts,
        durationMs=envelope.duration_ms,
    )
    return envelope


async def _run(call: ToolCall, runtime: Runtime, envelope: ToolResult, received_at: float) -> None:
    deadline = _deadline(call, received_at)
    tool, upstream = runtime.resolve(call.tool)
    structlog.contextvars.bind_contextvars(upstream=upstream.name)
    arguments = validate_arguments(call.arguments, runtime.validator(tool))
    if call.headers:
        encoded_size(call.headers)  # refuses text that is not valid Unicode
    if tool.kind == "builtin":
        envelope.result = run_catalog(tool.name, arguments, runtime.toolset)
        return
    turn = Turn(runtime.turns(upstream), upstream, deadline)
    await turn.take()
    try:
        request = _prepare(tool, upstream, arguments, call, runtime)
        logs.bind_secrets(request.secrets)
        if request.dropped_headers:
            log.info("call.headers_dropped", headers=list(request.dropped_headers))
        _describe_request(envelope, request, upstream)
        # A defined tool's own upstream is trusted configuration; everything else is egress-checked.
        trusted = None if tool.kind == "generic" else URL(request.url, encoded=True).origin()
        check = _redirect_check(trusted, upstream, runtime.policy)
        breaker = _breaker(runtime, upstream, trusted)
        attempt = Attempt(runtime, request, upstream, deadline, check, trusted, breaker, turn)
        with metrics.in_flight(tool.name, upstream.name):
            response = await _send_with_retries(attempt, envelope, read_limit(tool, upstream))
        shape_result(envelope, response, tool, upstream, request.secrets)
    finally:
        turn.give_back()


class Turn:
    """A call's place among the calls under way to its upstream: TURNS_PER_CONNECTION x max_concurrency
    of them per worker process. The others wait unprepared, in order of arrival; a burst of thousands
    would otherwise render and start every request in one go, and hold the loop for a second or more
    while the upstream's answers waited to be read. A call gives its turn back while it sleeps between
    attempts."""

    def __init__(self, turns: asyncio.Semaphore, upstream: Upstream, deadline: float) -> None:
        self._turns, self._upstream, self._deadline = turns, upstream, deadline
        self._held = self._sent = False  # _sent: an earlier attempt had its turn

    async def take(self) -> None:
        if self._held:
            return
        if self._turns.locked():
            await self._wait()
        else:
            await self._turns.acquire()  # at once
        self._held = self._sent = True

    async def _wait(self) -> None:
        """As long as a free pooled connection was waited for (or, at a rate-limited upstream, a slot)."""
        upstream = self._upstream
        limited = upstream.rate_limit is not None
        wait_s = min(MAX_RATE_WAIT_S if limited else upstream.timeout_s, self._deadline - time.time())
        try:
            async with asyncio.timeout(wait_s):
                await self._turns.acquire()
        except TimeoutError:
            error = errors.DeadlineExceeded if limited else errors.TimedOut
            raise error(
                f"The call waited {wait_s:.3g} seconds for its turn at the upstream, which had "
                f"{TURNS_PER_CONNECTION * upstream.max_concurrency} calls under way; "
                f"it was not sent{' again' if self._sent else ''}."
            ) from None

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._turns.release()


def _breaker(runtime: Runtime, upstream: Upstream, trusted: URL | None) -> CircuitBreaker | None:
    """The upstream's breaker, told of this call; the generic tool reaches many hosts, so no one breaker
    speaks for them."""
    if trusted is None:
        return None
    circuit = upstream.circuit
    breaker = runtime.breakers.get(upstream.name, circuit.threshold, circuit.cooldown_s)
    try:
        breaker.before_call()
    finally:
        metrics.set_circuit_state(upstream.name, cast(metrics.CircuitState, breaker.state))
    return breaker


def _prepare(tool: Tool, upstream: Upstream, arguments: dict[str, Any], call: ToolCall, rt: Runtime) -> PreparedRequest:
    if tool.kind == "generic":
        return render_generic(arguments, rt.policy)
    return with_idempotency_key(render(tool, upstream, arguments, call.headers, rt.environ), upstream, call)


def _upstream_name(runtime: Runtime, tool_name: str) -> str | None:
    """The upstream of a defined tool; None when the name (the model's) resolves to no tool."""
    tool = runtime.toolset.tools.get(ALIASES.get(tool_name, tool_name))
    return tool.upstream if tool is not None else None


def _deadline(call: ToolCall, received_at: float) -> float:
    """The wall-clock time by which the call must be over (the earlier of deadline and timeout)."""
    now = time.time()
    limits = []
    if call.deadline is not None:
        at = call.deadline if call.deadline.tzinfo else call.deadline.replace(tzinfo=UTC)
        limits.append(at.timestamp())
    if call.timeout_s is not None:
        limits.append(received_at + call.timeout_s)
    deadline = min(limits, default=float("inf"))
    if deadline <= now:
        raise errors.DeadlineExceeded("The call's deadline passed before it could start; it was not sent.")
    return deadline


def validate_arguments(arguments: dict[str, Any], validator: Draft202012Validator) -> dict[str, Any]:
    size = encoded_size(arguments)
    if size > MAX_ARGUMENTS_BYTES:
        raise errors.InvalidArguments(f"The arguments are too large ({size} bytes; at most {MAX_ARGUMENTS_BYTES}).")
    problems = [_explain(e) for e in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))]
    if problems:
        shown = problems[:_MAX_REPORTED_ERRORS]
        more = f" (and {len(problems) - len(shown)} more)" if len(problems) > len(shown) else ""
        raise errors.InvalidArguments("Invalid arguments: " + "; ".join(shown) + more + ".")
    return arguments


def encoded_size(value: Any) -> int:
    """UTF-8 size of a JSON value; text that is not valid Unicode (a lone surrogate) is refused."""
    try:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    except UnicodeEncodeError:
        raise errors.InvalidArguments("The arguments or headers contain text that is not valid Unicode.") from None


def _explain(error: SchemaViolation) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [p for p in cast(list[str], error.validator_value) if p not in error.instance]
        names = ", ".join(f"`{'.'.join(filter(None, [where, p]))}`" for p in missing)
        return f"{names} {'is' if len(missing) == 1 else 'are'} required"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        return f"{error.message}" + (f" in `{where}`" if where else "")
    return f"`{where or 'arguments'}`: {error.message}"


def with_idempotency_key(request: PreparedRequest, upstream: Upstream, call: ToolCall) -> PreparedRequest:
    """Unsafe methods are retried only on opt-in, and then carry the callId so the upstream can dedupe."""
    if request.method in IDEMPOTENT_METHODS or not upstream.retry.unsafe_methods:
        return request
    if any(name.lower() == "idempotency-key" for name, _ in request.headers):
        return request
    return replace(request, headers=(*request.headers, ("Idempotency-Key", call.call_id)))


def _describe_request(envelope: ToolResult, request: PreparedRequest, upstream: Upstream) -> None:
    envelope.method = request.method
    envelope.url = redact(request.url, request.secrets)
    envelope.headers = request.redacted_headers()
    if request.body is not None:
        text = request.body[: upstream.max_output_chars * 4].decode("utf-8", "replace")
        envelope.body = redact(text, request.secrets)[: upstream.max_output_chars]


@dataclass(frozen=True, slots=True)
class Attempt:
    """What each attempt of one call needs."""

    runtime: Runtime
    request: PreparedRequest
    upstream: Upstream
    deadline: float
    check: RedirectCheck
    trusted: URL | None
    breaker: CircuitBreaker | None
    turn: Turn

    async def send(self, limits: Limits) -> Response:
        """One attempt, in the call's turn, within the rate limit and the time left; its outcome is told
        to the breaker."""
        await self.turn.take()
        rate = self.upstream.rate_limit
        if rate is not None and self.runtime.redis is not None:
            horizon = min(self.deadline, time.time() + MAX_RATE_WAIT_S)
            key = RATE_LIMIT_KEY_PREFIX + self.upstream.name
            await ratelimit.acquire(self.runtime.redis, key, rate.per_second, rate.burst, horizon)
        budget = min(self.upstream.timeout_s, self.deadline - time.time())
        if budget <= 0:
            raise errors.TimedOut("The call ran out of time before the upstream answered.")
        try:
            async with asyncio.timeout(budget):
                response = await self.runtime.transport.send(
                    self.request, self.upstream, limits, self.check, self.trusted
                )
        except TimeoutError:
            self._record(failed=True)
            raise errors.TimedOut(f"The upstream did not answer within {budget:.3g} seconds.") from None
        except errors.TransportError:
            self._record(failed=True)
            raise
        self._record(failed=response.status >= 500)
        return response

    def _record(self, failed: bool) -> None:
        if self.breaker is None:
            return
        if failed:
            self.breaker.record_failure()
        else:
            self.breaker.record_success()
        metrics.set_circuit_state(self.upstream.name, cast(metrics.CircuitState, self.breaker.state))


def read_limit(tool: Tool, upstream: Upstream) -> int:
    """Bytes worth reading: all of them (to the cap) for a transform, else enough to fill the result."""
    if tool.transform is not None:
        return upstream.max_response_bytes
    chars = tool.max_output_chars or upstream.max_output_chars
    # At most 4 bytes a character, and room for a secret that straddles the cut to be found and redacted.
    return min(upstream.max_response_bytes, 4 * chars + _READ_MARGIN_BYTES)


async def _send_with_retries(attempt: Attempt, envelope: ToolResult, max_bytes: int) -> Response:
    upstream, request, deadline = attempt.upstream, attempt.request, attempt.deadline
    policy = upstream.retry
    may_retry = request.method in IDEMPOTENT_METHODS or policy.unsafe_methods
    attempts = policy.attempts if may_retry else 1
    limits = Limits(max_bytes, upstream.connect_timeout_s)
    for number in range(1, attempts + 1):
        envelope.attempts = number
        try:
            response = await attempt.send(limits)
        except errors.TransportError as exc:
            if number == attempts or not exc.retryable:
                raise
        else:
            if number == attempts or response.status not in policy.statuses:
                return response
            asked_s = parse_retry_after(response.retry_after, time.time())
            if asked_s is not None:
                if asked_s > MAX_RETRY_AFTER_S or time.time() + asked_s >= deadline:
                    return response  # the upstream asks for more time than the call has: its answer stands
                attempt.turn.give_back()
                await asyncio.sleep(asked_s)
                continue
        attempt.turn.give_back()
        await asyncio.sleep(min(_backoff(policy.backoff_s, policy.max_backoff_s, number), deadline - time.time()))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _backoff(base_s: float, cap_s: float, attempt: int) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap_s, base_s * 2 ** (attempt - 1)))


def _redirect_check(trusted: URL | None, upstream: Upstream, policy: EgressPolicy) -> RedirectCheck:
    """Each hop stays on the upstream's origin, or (where allowed) passes the egress policy."""

    def check(target: URL) -> None:
        if target.scheme not in {"http", "https"}:
            raise errors.EgressBlocked("Blocked by the egress policy: redirect to a non-HTTP scheme.")
        if trusted is not None and target.origin() == trusted:
            return
        if trusted is not None and not upstream.allow_offsite_redirects:
            raise errors.EgressBlocked("Blocked by the egress policy: the upstream redirected to another host.")
        policy.check_url(str(target))

    return check


def shape_result(
    envelope: ToolResult, response: Response, tool: Tool, upstream: Upstream, secrets: frozenset[str]
) -> None:
    """Fill the envelope from the response: transform, decode, redact, truncate."""
    envelope.status_code = response.status
    envelope.content_type = response.content_type
    ok = 200 <= response.status < 300
    text = decode(response.body, response.charset)
    if ok and tool.transform is not None:
        if not response.complete:
            raise errors.ResponseTooLarge(
                f"The response is larger than {upstream.max_response_bytes} bytes, "
                "and this tool needs the whole body to extract its result."
            )
        text = _transformed(tool, text)
    limit = tool.max_output_chars or upstream.max_output_chars
    text = redact(text, secrets)
    envelope.result = text[:limit]
    envelope.truncated = len(text) > limit or not response.complete
    if not ok:
        envelope.exit_code = 22
        envelope.error = {
            "type": "http_error",
            "message": f"The call failed: the upstream answered HTTP {response.status} {response.reason}. "
            "Its response body is in `result`.",
        }


def decode(body: bytes, charset: str | None) -> str:
    try:
        codec = codecs.lookup(charset or "utf-8").name
    except LookupError:
        codec = "utf-8"
    return body.decode(codec, errors="replace")


def _transformed(tool: Tool, text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        log.warning("call.transform_skipped", reason="response is not JSON")
        return text
    assert tool.transform is not None
    return json.dumps(tool.transform(data), ensure_ascii=False)
