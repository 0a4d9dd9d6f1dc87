"""Fault tests (SPEC §7): real worker processes, a real Redis-compatible server and a misbehaving upstream.

Everything listens on 127.0.0.1; every wait is bounded. Envelopes are counted per callId on a reply
stream (`replyTo`), so a duplicate publication would show. Figures worth reading are printed (`-s`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import (
    FAULTS,
    FaultUpstream,
    RawServer,
    Stack,
    TokenBucket,
    enqueue,
    holdings,
    make_call,
    make_stack,
    per_call,
    report,
    serving,
    stream_envelopes,
    wait_for_envelopes,
    warm_up,
)
from tests.support.servers import DnsServer
from tests.support.waiting import scaled, wait_until, wait_until_async
from worker.client import AsyncToolClient, ToolClient
from worker.constants import DEFAULT_QUEUE
from worker.envelope import ToolResult
from worker.protocol import task_messages
from worker.queue.leases import HOLDERS_KEY

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory,
    fault_upstream: FaultUpstream,
    raw_upstream: RawServer,
    dns_server: DnsServer,
) -> Iterator[Stack]:
    """One worker on tests/fixtures/faults/pipeline, shared by the tests that do not break it."""
    directory = tmp_path_factory.mktemp("pipeline")
    yield from serving(make_stack(directory, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url))


@pytest.fixture(scope="module")
def resilience(
    tmp_path_factory: pytest.TempPathFactory,
    fault_upstream: FaultUpstream,
    raw_upstream: RawServer,
    dns_server: DnsServer,
) -> Iterator[Stack]:
    """One worker on tests/fixtures/faults/resilience (circuit breaking and the rate limit)."""
    directory = tmp_path_factory.mktemp("resilience")
    stack = make_stack(directory, FAULTS / "resilience", fault_upstream.url, dns_server, raw_upstream.url)
    yield from serving(stack, "flaky", {})


# --- a worker killed mid-flight --------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_worker_killed_with_calls_in_flight(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """kill -9 of a worker holding calls of 200 in flight (1 s upstream), default settings: the live worker
    answers every call exactly once, the last within 15 s of the kill; only the killed worker's POSTs go twice."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url)
    try:
        workers = [stack.start_worker(), stack.start_worker()]
        warm_up(stack, "fast_get", {"id": "warm-up"})
        with stack.client() as r:
            wait_until(lambda: r.scard(HOLDERS_KEY) == 2, 60, "both workers taking messages")
            stream, tag = f"faults:kill:{uuid.uuid4().hex}", uuid.uuid4().hex[:8]
            calls = [make_call("work_post", {"id": f"{tag}-{i}", "delay": 1}, stream, 60) for i in range(200)]
            enqueue(r, calls, batch=25)
            wait_until(lambda: fault_upstream.state.in_flight["work"] >= 200, 30, "200 POSTs in flight")
            pid, held = holdings(r).most_common(1)[0]
            victim = next(w for w in workers if w.pid == pid)
            victim.kill()  # SIGKILL: no shutdown, no restore, nothing published
            killed_at = time.monotonic()
            victim.wait(10)
            wait_for_envelopes(r, stream, 200, 60)
            recovered_s = time.monotonic() - killed_at
            time.sleep(1)  # a late duplicate would arrive now
            envelopes = stream_envelopes(r, stream)
            left_held = sum(holdings(r).values())
    finally:
        stack.close()

    counts = per_call(envelopes)
    posts = Counter({call["arguments"]["id"]: fault_upstream.state.posts[call["arguments"]["id"]] for call in calls})
    report(
        "kill -9",
        messages_held_by_the_killed_worker=held,
        last_envelope_after_kill_s=round(recovered_s, 1),
        envelopes=len(envelopes),
        lost=len({c["callId"] for c in calls} - set(counts)),
        duplicated=sum(1 for n in counts.values() if n > 1),
        extra_posts=sum(posts.values()) - len(calls),
    )
    assert set(counts) == {c["callId"] for c in calls}, "a call was lost"
    assert max(counts.values()) == 1, "a call was answered twice"
    assert all(e["exitCode"] == 0 for e in envelopes), stack.log_tail()
    assert recovered_s < 15, f"the last envelope came {recovered_s:.1f} s after the kill"
    assert max(posts.values()) <= 2  # at-least-once toward the upstream, no call more than once again
    assert left_held == 0


# --- the Redis-compatible server restarted mid-run -------------------------------------------------


@pytest.mark.timeout(120)
async def test_redis_restarted_mid_run(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """The server (AOF) stops and comes back on the same port while 80 calls run and 80 wait: the client and the
    worker reconnect by themselves and every call is answered, once."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url, True)
    try:
        stack.start_worker()
        await asyncio.to_thread(warm_up, stack, "fast_get", {"id": "warm-up"})
        client = AsyncToolClient(stack.server.url, max_batch=10)
        try:
            # 16 batch messages of 10: 8 run (one per thread, so kombu has no pop outstanding), 8 wait.
            specs = [("outage_get", {"id": f"r{i}", "delay": 3}) for i in range(160)]
            call_ids = await client.submit_many(specs, timeout=100)
            results = [asyncio.ensure_future(client.result(cid, 100)) for cid in call_ids]
            await wait_until_async(lambda: fault_upstream.state.in_flight["outage"] >= 80, 30, "80 calls in flight")
            outage_started = time.monotonic()
            await asyncio.to_thread(stack.server.stop)
            await asyncio.sleep(1.5)
            await asyncio.to_thread(stack.server.start)
            outage_s = time.monotonic() - outage_started
            done, pending = await asyncio.wait(results, timeout=80)
            recovered_s = time.monotonic() - outage_started
            for future in pending:
                future.cancel()
        finally:
            await client.aclose()
        with stack.client() as r:
            done_markers = len(r.keys("celery-task-meta-*")) - 1  # less the warm-up
    finally:
        await asyncio.to_thread(stack.close)

    envelopes = [f.result() for f in done if f.exception() is None]
    report(
        "redis restart",
        calls=len(call_ids),
        outage_s=round(outage_s, 1),
        all_answered_after_s=round(recovered_s, 1),
        answered=len(envelopes),
        lost=len(call_ids) - len(envelopes),
        published=done_markers,
    )
    assert not pending, f"{len(pending)} calls unanswered 80 s after the restart\n{stack.log_tail()}"
    assert sorted(e.call_id for e in envelopes) == sorted(call_ids)
    assert all(e.exit_code == 0 for e in envelopes), Counter(e.exit_code for e in envelopes)
    assert done_markers == len(call_ids)


@pytest.mark.timeout(90)
async def test_worker_with_free_threads_survives_a_redis_restart(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """A worker running one call (free threads, so waiting on BRPOP) when the server restarts keeps serving."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url, True)
    try:
        process = stack.start_worker()
        await asyncio.to_thread(warm_up, stack, "fast_get", {"id": "warm-up"})
        client = AsyncToolClient(stack.server.url)
        try:
            (running,) = await client.submit_many([("outage_get", {"id": "running", "delay": 3})], timeout=60)
            await wait_until_async(lambda: fault_upstream.state.in_flight["outage"] >= 1, 30, "the call in flight")
            await asyncio.to_thread(stack.server.stop)
            await asyncio.sleep(1.5)
            await asyncio.to_thread(stack.server.start)
            (later,) = await client.submit_many([("fast_get", {"id": "after-restart"})], timeout=60)
            answers = asyncio.gather(client.result(running, 60), client.result(later, 60))
            await wait_until_async(lambda: answers.done() or process.poll() is not None, 60, "the answers")
            alive = process.poll() is None
            if not answers.done():
                answers.cancel()
                await asyncio.gather(answers, return_exceptions=True)
            # The call that finished during the outage was acknowledged on the restarted server: nothing
            # is left for the visibility timeout to deliver again.
            unacked = await asyncio.to_thread(lambda: stack.client().hlen("unacked"))
        finally:
            await client.aclose()
    finally:
        await asyncio.to_thread(stack.close)
    assert alive, "the worker exited:\n" + stack.log_tail()
    assert [r.exit_code for r in answers.result()] == [0, 0]
    assert unacked == 0


@pytest.mark.timeout(90)
async def test_warm_shutdown_finishes_the_calls_in_flight(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """SIGTERM with calls running: they are answered and acknowledged, then the worker exits 0."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url)
    try:
        process = stack.start_worker()
        await asyncio.to_thread(warm_up, stack, "fast_get", {"id": "warm-up"})
        client = AsyncToolClient(stack.server.url)
        try:
            running = await client.submit_many(
                [("outage_get", {"id": f"shutdown-{i}", "delay": 2}) for i in range(3)], timeout=60
            )
            await wait_until_async(lambda: fault_upstream.state.in_flight["outage"] >= 3, 30, "the calls in flight")
            process.terminate()
            results = await asyncio.gather(*(client.result(call_id, 30) for call_id in running))
            code = await asyncio.to_thread(process.wait, 30)
            unacked = await asyncio.to_thread(lambda: stack.client().hlen("unacked"))
            held = await asyncio.to_thread(lambda: sum(holdings(stack.client()).values()))
        finally:
            await client.aclose()
    finally:
        await asyncio.to_thread(stack.close)
    assert [r.exit_code for r in results] == [0, 0, 0]
    assert code == 0, stack.log_tail()
    assert unacked == 0 and held == 0


# --- the broker connection cut while calls run -----------------------------------------------------


def due_in(message: str, seconds: float) -> str:
    """A task message with an ETA: the worker receives it at once and starts it only then."""
    payload = json.loads(message)
    payload["headers"]["eta"] = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()
    return json.dumps(payload)


@pytest.mark.timeout(90)
def test_a_broker_connection_cut_sends_no_running_call_twice_and_loses_no_waiting_one(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """Every connection of the worker cut (as a failover cuts those to the old primary) while a lone call and a
    batch of three run and a call waits for its ETA: the running calls' messages stay held, not put back, and
    are acknowledged on the new connection when the calls end; the waiting one (received, not started) goes
    back to its queue and runs at its time. One POST and one envelope each, nothing left queued or held."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url)
    stream, tag = f"faults:cut:{uuid.uuid4().hex}", uuid.uuid4().hex[:8]
    running = [make_call("work_post", {"id": f"{tag}-{i}", "delay": 3}, stream) for i in range(4)]
    waiting = make_call("work_post", {"id": f"{tag}-later", "delay": 0}, stream)
    keys = [call["arguments"]["id"] for call in [*running, waiting]]
    try:
        process = stack.start_worker()
        warm_up(stack, "fast_get", {"id": "warm-up"})
        with stack.client() as r:
            r.lpush(DEFAULT_QUEUE, due_in(task_messages([waiting], DEFAULT_QUEUE, 1)[0], 6))
            enqueue(r, running[:1], batch=1)
            enqueue(r, running[1:], batch=3)
            wait_until(
                lambda: all(fault_upstream.state.posts[key] for key in keys[:4]) and sum(holdings(r).values()) == 3,
                30,
                "four POSTs in flight and the call due later received",
            )
            cut = r.client_kill_filter(_type="normal", skipme=True)
            wait_for_envelopes(r, stream, len(keys), 30)
            wait_until(lambda: sum(holdings(r).values()) == 0, 30, "the messages acknowledged")
            alive, queued = process.poll() is None, r.llen(DEFAULT_QUEUE)
            envelopes = stream_envelopes(r, stream)
    finally:
        stack.close()
    posts = [fault_upstream.state.posts[key] for key in keys]
    report("connections cut mid-call", connections_cut=cut, posts=posts, envelopes=len(envelopes))
    assert cut > 0 and alive, stack.log_tail()
    assert posts == [1] * len(keys), stack.log_tail()
    assert per_call(envelopes) == Counter({call["callId"]: 1 for call in [*running, waiting]})
    assert queued == 0


# --- a burst of 10,000 calls -----------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_burst_of_10000_calls(pipeline: Stack, fault_upstream: FaultUpstream) -> None:
    """10,000 calls enqueued at once (batch messages of 100): 10,000 envelopes, none twice, each GET sent once."""
    stream, tag = f"faults:burst:{uuid.uuid4().hex}", uuid.uuid4().hex[:8]
    calls = [make_call("fast_get", {"id": f"{tag}-{i}"}, stream, timeout_s=120) for i in range(10_000)]
    with pipeline.client() as r:
        started = time.monotonic()
        enqueue(r, calls, batch=100)
        took_s = wait_for_envelopes(r, stream, 10_000, 120)
        elapsed_s = time.monotonic() - started
        time.sleep(1)  # a late duplicate would arrive now
        envelopes = stream_envelopes(r, stream)
    counts = per_call(envelopes)
    gets = [fault_upstream.state.gets[c["arguments"]["id"]] for c in calls]
    report(
        "burst",
        calls=len(calls),
        envelopes=len(envelopes),
        duplicated=sum(1 for n in counts.values() if n > 1),
        seconds=round(elapsed_s, 1),
        calls_per_s=round(len(calls) / took_s),
    )
    assert len(envelopes) == 10_000
    assert set(counts) == {c["callId"] for c in calls} and max(counts.values()) == 1
    assert Counter(e["exitCode"] for e in envelopes) == {0: 10_000}
    assert max(gets) == 1 and min(gets) == 1


# --- upstream behaviours ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["delta", "date"])
def test_503_with_retry_after_then_200(pipeline: Stack, fault_upstream: FaultUpstream, form: str) -> None:
    """A 503 with Retry-After is retried after the time it asks for, then the 200 is the result."""
    key = uuid.uuid4().hex
    with ToolClient(pipeline.server.url) as tool_client:
        result = tool_client.call("retry_after", {"key": key, "form": form}, timeout=30)
    arrivals = fault_upstream.state.arrivals[key]
    report("retry-after", form=form, attempts=result.attempts, gap_s=round(arrivals[-1] - arrivals[0], 3))
    assert result.exit_code == 0 and result.attempts == 2, result.to_dict()
    assert len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 0.95


@pytest.mark.parametrize(
    ("tool", "exit_code", "error_type"),
    [
        ("reset_mid_body", 56, "receive_failed"),
        ("no_response", 52, "empty_response"),
    ],
)
def test_connection_breaks(
    pipeline: Stack, raw_upstream: RawServer, tool: str, exit_code: int, error_type: str
) -> None:
    """A reset in the middle of the body is exit 56; a hang-up before any response is exit 52."""
    with ToolClient(pipeline.server.url) as tool_client:
        result = tool_client.call(tool, {}, timeout=30)
    assert result.exit_code == exit_code, result.to_dict()
    assert result.error is not None and result.error["type"] == error_type
    assert "127.0.0.1" in result.error["message"]


@pytest.mark.parametrize("tool", ["slow_first_byte", "slow_body"])
def test_slow_upstream_times_out(pipeline: Stack, tool: str) -> None:
    """Headers (or the rest of the body) later than the 1 s timeout: exit 28, on time."""
    with ToolClient(pipeline.server.url) as tool_client:
        result = tool_client.call(tool, {"delay": 4}, timeout=30)
    assert result.exit_code == 28, result.to_dict()
    assert 900 <= result.duration_ms < 2500


# --- concurrency limit ------------------------------------------------------------------------------


async def test_concurrency_limit_never_exceeded(pipeline: Stack, fault_upstream: FaultUpstream) -> None:
    """An upstream with max_concurrency 5 never sees more than 5 calls at once from a worker process."""
    fault_upstream.state.max_in_flight["concurrency"] = 0
    # Three batch messages of 5 run on three threads of one process, which share the upstream's pool.
    results = await call_in_batches(pipeline, [("narrow_slow", {"delay": 0.2})] * 15, batch=5)
    report("concurrency", calls=len(results), max_in_flight=fault_upstream.state.max_in_flight["concurrency"])
    assert [r.exit_code for r in results] == [0] * 15
    assert fault_upstream.state.max_in_flight["concurrency"] == 5


async def test_calls_over_the_concurrency_limit_wait_for_a_slot(pipeline: Stack) -> None:
    """Calls beyond max_concurrency queue for a connection (within their own timeout) instead of failing."""
    # Five waves of 5: the last one waits 2 s for a connection, well within the 20 s timeout.
    results = await call_in_batches(pipeline, [("narrow_slow", {"delay": 0.5})] * 25, batch=5)
    failed = [r for r in results if r.exit_code != 0]
    report(
        "concurrency queue",
        exit_codes=dict(Counter(r.exit_code for r in results)),
        failed_after_ms=sorted({round(r.duration_ms, -2) for r in failed}),
        messages=sorted({r.error["message"] for r in failed if r.error}),
    )
    assert [r.exit_code for r in results] == [0] * 25


async def call_in_batches(stack: Stack, specs: list[tuple[str, dict[str, Any]]], batch: int) -> list[ToolResult]:
    """Send the calls at once as batch messages of `batch` calls; their envelopes in order."""
    client = AsyncToolClient(stack.server.url, max_batch=batch)
    try:
        return await client.acall_many(specs, timeout=30)
    finally:
        await client.aclose()


def test_429_storm_without_a_rate_limit(pipeline: Stack, fault_upstream: FaultUpstream) -> None:
    """Without a rate limit, 40 calls at once toward an upstream that allows 10/s mostly end as 429 (exit 22)."""
    state = fault_upstream.state
    state.limited_statuses.clear()
    state.limiter = TokenBucket(10, 3)
    with ToolClient(pipeline.server.url) as tool_client:
        results = tool_client.call_many([("unlimited_get", {"id": str(i)}) for i in range(40)], timeout=60)
    report(
        "429 storm, no limit",
        exit_codes=dict(Counter(r.exit_code for r in results)),
        upstream=dict(state.limited_statuses),
    )
    assert sum(state.limited_statuses.values()) == 40  # the 429s are not retried: 429 is not a retry status here
    assert Counter(r.status_code for r in results) == state.limited_statuses
    assert all(r.exit_code == (0 if r.status_code == 200 else 22) for r in results)
    assert state.limited_statuses[429] >= 30


# --- circuit breaking and the shared rate limit -----------------------------------------------------


def test_circuit_opens_and_closes(resilience: Stack, fault_upstream: FaultUpstream) -> None:
    """3 consecutive 503s open the circuit (exit 69, nothing sent); after 2 s one trial goes; success closes it."""
    state = fault_upstream.state
    with ToolClient(resilience.server.url) as tool_client:

        def call() -> ToolResult:
            return tool_client.call("flaky", {}, timeout=30)

        state.down = True
        try:
            assert [call().exit_code for _ in range(3)] == [22, 22, 22]
            hits = state.flaky_hits
            refused = call()
            assert refused.exit_code == 69 and state.flaky_hits == hits, refused.to_dict()
            assert refused.error is not None and "retrying in" in refused.error["message"]
            time.sleep(2.1)  # the cool-down
            assert call().exit_code == 22  # the trial failed: open again for a full cool-down
            assert call().exit_code == 69 and state.flaky_hits == hits + 1
        finally:
            state.down = False
        time.sleep(2.1)
        assert call().exit_code == 0  # the trial succeeded: closed
        assert [call().exit_code for _ in range(5)] == [0] * 5
        assert state.flaky_hits == hits + 7


def test_429_storm_avoided_by_the_rate_limit(resilience: Stack, fault_upstream: FaultUpstream) -> None:
    """40 calls at once toward an upstream that allows 10/s: the shared limit paces them, no 429 comes back."""
    fault_upstream.state.limited_statuses.clear()
    # The workers send 100 ms apart (bursts of 2); a send that leaves late and the next on time arrive closer
    # than that. The upstream forgives one interval of such lateness, more while the machine is busy.
    lateness = math.ceil(scaled(0.1) * 10)
    fault_upstream.state.limiter = TokenBucket(10, 2 + lateness)
    started = time.monotonic()
    with ToolClient(resilience.server.url) as tool_client:
        results = tool_client.call_many([("limited_get", {"id": str(i)}) for i in range(40)], timeout=60)
    elapsed_s = time.monotonic() - started
    report("429 storm", seconds=round(elapsed_s, 1), upstream=dict(fault_upstream.state.limited_statuses))
    assert [r.exit_code for r in results] == [0] * 40, Counter(r.exit_code for r in results)
    assert fault_upstream.state.limited_statuses[429] == 0
    assert elapsed_s >= (40 - 2) / 10 - 0.5  # paced, not lucky


def redelivery(message: str) -> str:
    """A message as kombu's Redis transport puts it back on its queue after a lost worker or connection."""
    payload = json.loads(message)
    payload["headers"]["redelivered"] = True
    payload["properties"]["delivery_info"]["redelivered"] = True
    return json.dumps(payload)


def test_a_message_delivered_again_after_its_result_is_not_executed_again(
    pipeline: Stack, fault_upstream: FaultUpstream
) -> None:
    """The same message a second time, marked as kombu marks a redelivery: one POST, one envelope."""
    stream, key = f"faults:again:{uuid.uuid4().hex}", uuid.uuid4().hex
    call = make_call("work_post", {"id": key, "delay": 0}, stream)

    def skipped() -> bool:
        return any(
            call["callId"] in line for line in pipeline.log_tail(100_000).splitlines() if "already_answered" in line
        )

    with pipeline.client() as r:
        enqueue(r, [call], batch=1)
        wait_for_envelopes(r, stream, 1, 30)
        r.lpush(DEFAULT_QUEUE, redelivery(task_messages([call], DEFAULT_QUEUE, 1)[0]))
        wait_until(skipped, 30, "the worker to skip the repeated call")
        time.sleep(0.5)  # a second envelope would be published by now
        envelopes = stream_envelopes(r, stream)
    assert [e["callId"] for e in envelopes] == [call["callId"]]
    assert fault_upstream.state.posts[key] == 1
