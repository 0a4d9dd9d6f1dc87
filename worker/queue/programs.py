"""Programs parked while their tool calls run (code mode, SPEC 19, docs/guides/code-mode.md).

A program is a queued call (`run_code`). The worker that takes it runs one stretch in the sandbox
(worker/program/sandbox.py): until it ends (its envelope is published as any call's) or until every task
of it waits for tool calls. Then its state and its calls go to Redis in one transaction: the run's record
(worker/program/runs.py) and one message per child call on its tenant's queues, so that either all are
sent or none; its own message is acknowledged and it holds no worker slot. Each child answered wakes it
(`answered`): the last one puts its message back on the queue, in the transaction that marks it queued,
and whichever worker takes it resumes it from the stored state with the stored answers. A worker lost
mid-stretch: the message comes back, the stretch runs again from the same state, and the calls it makes
are the same calls with the same callIds, none of which was sent.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any, Literal

import redis.asyncio as aioredis
import structlog

from worker import errors
from worker.call.runtime import Runtime
from worker.constants import DEFAULT_QUEUE, DEFAULT_TENANT, PROGRAM_TOOL, RESULT_KEY_PREFIX
from worker.envelope import ToolResult
from worker.program import runs
from worker.program.runs import CANCELLED, QUEUED, WAITING, Run
from worker.program.sandbox import Finished, LimitReached, ProgramFailed, Sandbox, Suspended
from worker.protocol import ToolCall, envelope_from_meta, task_message
from worker.queue import scheduler
from worker.queue.approvals import PARKED_NOW
from worker.queue.publisher import Publisher

log = structlog.get_logger("toolworker.programs")

MAX_CODE_CHARS = 100_000


class Programs:
    """At the worker: run a program's stretch, park it with its calls sent, wake it when they answered."""

    def __init__(
        self,
        client: aioredis.Redis,
        runtime: Runtime,
        sandbox: Sandbox,
        publisher: Publisher,
        timeout_s: float,
        keep_s: int,
    ) -> None:
        self.client, self.runtime, self.sandbox, self.publisher = client, runtime, sandbox, publisher
        self.timeout_s, self.keep_s = timeout_s, keep_s

    async def serve(self, call: ToolCall) -> ToolResult | Literal["parked"]:
        """The program's envelope, or PARKED_NOW while its calls run."""
        run = await self._load(call.call_id) or self._new(call)
        if run.state == WAITING:  # a message delivered again after it was parked: its children wake it
            await self.wake(run.run_id)
            return PARKED_NOW
        if run.state == CANCELLED:
            error = ProgramCancelled("The program was cancelled while its tool calls ran; it was not resumed.")
            return ToolResult.failure(call.call_id, PROGRAM_TOOL, error, output=run.output, calls=run.calls)
        try:
            outcome = await self._stretch(run)
            if outcome is None:
                return PARKED_NOW
            if isinstance(outcome, Finished):
                return _finished(call, run, outcome)
            return await self._park(call, run, outcome)
        except ProgramFailed as exc:
            log.info("program.failed", callId=call.call_id, exitCode=exc.exit_code, error=exc.type)
            return ToolResult.failure(call.call_id, PROGRAM_TOOL, exc, output=run.output, calls=run.calls)

    async def answered(self, call_id: str) -> None:
        """A call was answered: when it is a program's, the program may go on."""
        run_id = runs.parent_of(call_id)
        if run_id is not None:
            await self.wake(run_id)

    async def wake(self, run_id: str) -> None:
        """Put a waiting program back on the queue once every call it waits for is answered (once: the
        transaction that pushes it marks it queued)."""
        key = runs.run_key(run_id)
        if await _answered_call(self.client, key) is None:  # most answers: the others still run
            return
        async with self.client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                call = await _answered_call(pipe, key)
                if call is None:
                    return
                pipe.multi()
                _requeue(pipe, Run(run_id, call=call), QUEUED)
                await pipe.execute()
            except aioredis.WatchError:  # another answer woke it meanwhile
                return
        log.info("program.woken", callId=run_id)

    async def _load(self, run_id: str) -> Run | None:
        return Run.parsed(run_id, await self.client.hgetall(runs.run_key(run_id)))

    def _new(self, call: ToolCall) -> Run:
        message = call.model_dump(mode="json", by_alias=True, exclude_none=True)
        return Run(call.call_id, call=message, started=time.time(), tools=self._offered(call))

    def _offered(self, call: ToolCall) -> list[str]:
        """The tools the program's `tools` has: those served, within the list the call names (its
        principal's grant, as the gateway computed it) when it names one."""
        served = set(self.runtime.toolset.tools) - {PROGRAM_TOOL}
        named = call.arguments.get("tools")
        return sorted(served & {str(n) for n in named} if isinstance(named, list) else served)

    async def _stretch(self, run: Run) -> Suspended | Finished | None:
        """Start the program, or resume it with its calls' answers; None when an answer is still missing."""
        if time.time() > run.started + self.timeout_s:
            text = f"The program ran longer than TOOLWORKER_CODE_TIMEOUT_SECONDS ({self.timeout_s:g} s)."
            raise ProgramFailed(LimitReached(text))
        if not run.snapshot:
            return await self.sandbox.start(_code(run.call), run.tools)
        envelopes = await self._envelopes(list(run.pending.values()))
        if any(envelope is None for envelope in envelopes.values()):
            await self.client.hset(runs.run_key(run.run_id), "state", WAITING)
            await self.wake(run.run_id)
            return None
        answers = {monty_id: runs.answer_of(envelopes[child] or {}) for monty_id, child in run.pending.items()}
        run.calls += [runs.call_line(envelopes[c] or {}) for c in sorted(run.pending.values(), key=_seq_of)]
        return await self.sandbox.resume(run.snapshot, answers, _code(run.call))

    async def _envelopes(self, call_ids: list[str]) -> dict[str, dict[str, Any] | None]:
        values = await self.client.mget([RESULT_KEY_PREFIX + c for c in call_ids]) if call_ids else []
        return {c: envelope_from_meta(v) if v else None for c, v in zip(call_ids, values, strict=True)}

    async def _park(self, call: ToolCall, run: Run, suspended: Suspended) -> Literal["parked"]:
        """Store the state and send its calls, in one transaction; the program then holds nothing."""
        if not suspended.requests:
            raise ProgramFailed(errors.InternalError("The program waits for something that is not a tool call."))
        max_calls = self.sandbox.limits.max_calls
        if run.seq + len(suspended.requests) > max_calls:
            text = f"The program made more than TOOLWORKER_CODE_MAX_CALLS ({max_calls}) tool calls."
            raise ProgramFailed(LimitReached(text))
        deadline = runs.deadline_of(call, run.started, self.timeout_s)
        by_queue: dict[str, list[str]] = defaultdict(list)
        run.pending, run.tools_of = {}, {}
        for request in suspended.requests:
            child = runs.child_id(run.run_id, run.seq)
            run.seq, run.pending[request.monty_id] = run.seq + 1, child
            run.tools_of[child] = request.tool
            message = runs.child_call(call, child, request, deadline)
            queue = self._queue_of(request.tool)
            by_queue[queue].append(task_message(child, [message], queue))
        run.state, run.snapshot, run.output = WAITING, suspended.state, run.output + suspended.output
        await self._send(run, call.tenant, by_queue)
        log.info("program.parked", callId=call.call_id, calls=len(suspended.requests), sent=run.seq)
        return PARKED_NOW

    def _queue_of(self, tool: str) -> str:
        try:
            return self.runtime.resolve(tool)[1].queue or DEFAULT_QUEUE
        except errors.ToolError:  # answered 64 by whichever worker takes it
            return DEFAULT_QUEUE

    async def _send(self, run: Run, tenant: str, by_queue: dict[str, list[str]]) -> None:
        """The run's record and its children's messages, in one transaction; children a full tenant queue
        refused are answered 75 (and so reach the program as a ToolError)."""
        key = runs.run_key(run.run_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=run.fields())
            pipe.expire(key, int(self.timeout_s) + self.keep_s)
            for queue, messages in by_queue.items():
                scheduler.enqueue(pipe, queue, tenant, messages, len(messages))
            replies = await pipe.execute()
        refused = [scheduler.refused_limit(reply) for reply in replies[2:]]
        for messages, limit in zip(by_queue.values(), refused, strict=True):
            if limit is not None:
                await self._refuse(messages, tenant, limit)

    async def _refuse(self, messages: list[str], tenant: str, limit: int) -> None:
        for message in messages:
            child = json.loads(json.loads(message)["body"])[0][0]
            error = errors.TenantQueueFull(tenant, limit)
            await self.publisher.publish_one(ToolResult.failure(child["callId"], child["tool"], error), None)
            await self.answered(child["callId"])


class ProgramCancelled(errors.DeadlineExceeded):
    """A program cancelled while it waited for its tool calls (75)."""

    type = "program_cancelled"


async def cancel(client: aioredis.Redis, run_id: str) -> dict[str, str] | None:
    """Cancel a waiting program: marked cancelled, its message back on the queue (a worker answers it);
    the children it waited for, callId -> tool, for the caller to withdraw those not started. None when
    it is not waiting (not a program, queued, running, or over)."""
    key = runs.run_key(run_id)
    async with client.pipeline(transaction=True) as pipe:
        try:
            await pipe.watch(key)
            run = Run.parsed(run_id, await pipe.hgetall(key))
            if run is None or run.state != WAITING:
                return None
            pipe.multi()
            _requeue(pipe, run, CANCELLED)
            await pipe.execute()
        except aioredis.WatchError:  # woken meanwhile: it runs on
            return None
    log.info("program.cancelled", callId=run_id, children=len(run.tools_of))
    return run.tools_of


async def _answered_call(client: Any, key: str) -> dict[str, Any] | None:
    """The call of a waiting program whose every awaited call is answered; None otherwise. Reads the
    state, the callIds and the call only (not the snapshot), and counts the answers without reading them."""
    state, pending, call = await client.hmget(key, ["state", "pending", "call"])
    if state is None or state.decode() != WAITING:
        return None
    children = list(json.loads(pending or b"{}").values())
    answered = await client.exists(*[RESULT_KEY_PREFIX + c for c in children]) if children else 0
    return dict(json.loads(call)) if answered == len(children) else None


def _requeue(pipe: Any, run: Run, state: str) -> None:
    """In a transaction: the run's new state, and its message back on its tenant's queue."""
    pipe.hset(runs.run_key(run.run_id), "state", state)
    message = task_message(run.run_id, [run.call], DEFAULT_QUEUE)
    source = scheduler.tenant_list(DEFAULT_QUEUE, run.call.get("tenant") or DEFAULT_TENANT)
    pipe.lpush(source, message)
    scheduler.requeued(pipe, source, message.encode(), in_flight=False)


def _code(call: dict[str, Any]) -> str:
    code = (call.get("arguments") or {}).get("code")
    if not isinstance(code, str) or not code.strip():
        raise ProgramFailed(errors.InvalidArguments("`code` must be the program's text, a non-empty string."))
    if len(code) > MAX_CODE_CHARS:
        raise ProgramFailed(errors.InvalidArguments(f"A program is at most {MAX_CODE_CHARS} characters."))
    return code


def _seq_of(child: str) -> int:
    return int(child.rpartition(runs.CHILD_MARK)[2])


def _finished(call: ToolCall, run: Run, finished: Finished) -> ToolResult:
    """The envelope of a program that ended: its value (as JSON text, and as structuredContent when it is an
    object or an array), what it printed, its calls."""
    value = finished.value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    structured = value if isinstance(value, dict | list) else None  # a scalar is its text alone
    output = run.output + finished.output
    log.info("program.finished", callId=call.call_id, calls=run.seq)
    return ToolResult(call.call_id, PROGRAM_TOOL, result=text, structured=structured, output=output, calls=run.calls)
