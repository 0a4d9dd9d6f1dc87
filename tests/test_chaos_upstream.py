"""Hostile upstreams through a real worker (docs/concepts/delivery.md): whatever an upstream sends,
each call gets exactly one envelope with the right exit code and a clear message, nothing stays held,
nothing that should not be reaches the worker's log, and the worker goes on answering.

The upstream is tests/support/hostile.py (a raw socket server on 127.0.0.1); the worker runs on
tests/fixtures/chaos with a Redis-compatible server of its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import FIXTURES, SECRET_TOKEN, start_worker, stop_worker, worker_env
from tests.support.hostile import BOMB_BYTES, INJECTED_BODY, HostileUpstream
from tests.support.log_lines import log_events
from tests.support.servers import DnsServer
from tests.support.waiting import wait_until
from worker.constants import DEFAULT_QUEUE
from worker.dev.embedded import EmbeddedRedis
from worker.protocol import task_messages
from worker.queue.leases import INFLIGHT_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(120)]

ANSWER_WITHIN_S = 60.0
OUTPUT_CHARS = 2000  # the hostile upstream's max_output_chars


@dataclass
class Chaos:
    """A Redis-compatible server, one worker on tests/fixtures/chaos, the hostile upstream."""

    redis: redis.Redis
    upstream: HostileUpstream
    log_path: Path
    worker_pid: int

    def log_from(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def peak_memory_bytes(self) -> int:
        """The worker process's peak resident memory so far (VmHWM)."""
        status = Path(f"/proc/{self.worker_pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory, dns_server: DnsServer) -> Iterator[Chaos]:
    directory = tmp_path_factory.mktemp("chaos")
    upstream = HostileUpstream().start()
    server = EmbeddedRedis(directory / "redis").start()
    env = worker_env(server.url, upstream.url, dns_server.address, FIXTURES / "chaos")
    env["TEST_RAW_URL"] = upstream.url
    log_path = directory / "worker.log"
    process = start_worker(env, log_path)
    client = redis.Redis.from_url(server.url)
    try:
        stack = Chaos(client, upstream, log_path, process.pid)
        assert_answers_its_own_calls(stack)  # up before the first case
        yield stack
    finally:
        stop_worker(process)
        server.stop()
        upstream.stop()
        client.close()


def held(client: redis.Redis) -> int:
    """Messages held in any worker's in-flight lists (taken, not yet acknowledged)."""
    return sum(int(client.llen(key)) for key in client.scan_iter(match=INFLIGHT_PREFIX + "*"))


def call(stack: Chaos, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Enqueue one call as any producer would, with a reply stream of its own; once its message is no
    longer held (acknowledged), the stream must hold exactly one envelope, for this call."""
    call_id, stream = str(uuid.uuid4()), f"chaos:replies:{uuid.uuid4().hex}"
    message = {"callId": call_id, "tool": tool, "arguments": arguments, "replyTo": stream}
    stack.redis.lpush(DEFAULT_QUEUE, *task_messages([message], DEFAULT_QUEUE, 1))
    wait_until(lambda: stack.redis.xlen(stream) >= 1, ANSWER_WITHIN_S, f"the envelope of {tool}{arguments}")
    wait_until(lambda: held(stack.redis) == 0, ANSWER_WITHIN_S, "nothing held")
    entries: Any = stack.redis.xrange(stream)
    envelopes = [json.loads(data[b"envelope"].decode("utf-8")) for _, data in entries]  # strict UTF-8
    assert [e["callId"] for e in envelopes] == [call_id]
    return envelopes[0]


def assert_answers_its_own_calls(stack: Chaos, count: int = 3) -> None:
    """The worker still answers good calls, each with its own answer."""
    for _ in range(count):
        token = uuid.uuid4().hex
        envelope = call(stack, "hostile_get", {"case": f"echo-{token}"})
        assert (envelope["exitCode"], envelope["result"]) == (0, token), envelope


def assert_clean_log(text: str) -> None:
    assert "Traceback" not in text, text[-5000:]
    assert SECRET_TOKEN not in text


@pytest.mark.parametrize("bomb", ["gzip-bomb", "brotli-bomb"])
def test_a_compression_bomb_never_expands_in_memory(chaos: Chaos, bomb: str) -> None:
    """A bomb that expands to 64 MiB is read to the 1 MiB cap and no further: the worker's peak memory
    grows by far less than what the bomb would expand to. (First in the module: no bomb was read before.)"""
    before = chaos.peak_memory_bytes()
    for _ in range(3):
        assert call(chaos, "hostile_extract", {"case": bomb})["exitCode"] == 63
    grown = chaos.peak_memory_bytes() - before
    print(f"\n[chaos] {bomb}: peak memory grew by {grown / 2**20:.1f} MiB")
    assert grown < BOMB_BYTES // 4


@dataclass(frozen=True)
class Case:
    name: str
    tool: str
    exit_code: int
    message: str | None  # a fragment of the error message; None: no error
    truncated: bool = False


CASES = [
    Case("gzip-bomb", "hostile_get", 0, None, truncated=True),
    Case("gzip-bomb", "hostile_extract", 63, "larger than 1048576 bytes"),
    Case("brotli-bomb", "hostile_get", 0, None, truncated=True),
    Case("brotli-bomb", "hostile_extract", 63, "larger than 1048576 bytes"),
    Case("endless", "hostile_get", 0, None, truncated=True),
    Case("endless", "hostile_extract", 63, "larger than 1048576 bytes"),
    Case("slow-body", "hostile_get", 28, "did not answer within 3 seconds"),
    Case("short-length", "hostile_get", 56, "broke while the response was being received"),
    # The extra bytes come in the same packet as the announced body: aiohttp refuses the whole response.
    Case("long-length", "hostile_get", 56, "or more bytes than its Content-Length announced"),
    Case("many-headers", "hostile_get", 56, "not valid HTTP: too many header lines"),
    Case("huge-header", "hostile_get", 56, "not valid HTTP: a status or header line over the size limit"),
    Case("redirect-loop", "hostile_get", 47, "redirected more than 5 times"),
    Case("garbage-status", "hostile_get", 56, "not valid HTTP: a malformed status line"),
    Case("latin1-404", "hostile_get", 22, "HTTP 404 Não encontrado"),
    Case("latin1-content-type", "hostile_get", 0, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.name}-{c.tool}")
def test_hostile_upstream_keeps_every_promise(chaos: Chaos, case: Case) -> None:
    """One envelope with the right exit code and a clear message, nothing held, a clean log, and the
    worker answers good calls afterwards."""
    offset = chaos.log_size()
    envelope = call(chaos, case.tool, {"case": case.name})
    assert envelope["exitCode"] == case.exit_code, envelope
    if case.message is None:
        assert envelope["error"] is None, envelope
    else:
        assert case.message in envelope["error"]["message"], envelope
    assert envelope["truncated"] is case.truncated
    assert len(envelope["result"]) <= OUTPUT_CHARS
    assert_answers_its_own_calls(chaos)
    assert_clean_log(chaos.log_from(offset))


def test_non_utf8_header_bytes_are_published_as_latin1(chaos: Chaos) -> None:
    """A Latin-1 reason phrase and a Content-Type with bytes that are not UTF-8 reach the envelope as
    valid text, each such byte read as Latin-1 (as docs/concepts/envelope.md says)."""
    not_found = call(chaos, "hostile_get", {"case": "latin1-404"})
    assert not_found["error"]["message"].startswith("The call failed: the upstream answered HTTP 404 Não encontrado.")
    assert not_found["result"] == "not found"
    typed = call(chaos, "hostile_get", {"case": "latin1-content-type"})
    assert typed["contentType"] == "text/plain; charset=iso-8859-1; note=déjà"
    assert typed["result"] == "café"


@pytest.mark.parametrize("round_", range(3))
def test_a_response_injected_on_an_idle_connection_reaches_no_call(chaos: Chaos, round_: int) -> None:
    """An upstream that sends a second, unasked response on an idle keep-alive connection: the worker
    drops that connection, and every later call gets its own answer, every time (three rounds)."""
    offset = chaos.log_size()
    chaos.upstream.injected.clear()
    chaos.upstream.poisoned_dropped.clear()
    first = call(chaos, "hostile_get", {"case": "inject"})
    assert (first["exitCode"], first["result"]) == (0, "first")
    assert chaos.upstream.injected.wait(10)
    chaos.upstream.poisoned_dropped.wait(2)  # bounded: without the guard it never comes, and the calls show it
    answers = []
    for _ in range(5):
        token = uuid.uuid4().hex
        answers.append((token, call(chaos, "hostile_get", {"case": f"echo-{token}"})["result"]))
    assert all(token == result for token, result in answers), answers
    assert INJECTED_BODY.decode() not in [result for _, result in answers]
    assert chaos.upstream.poisoned_dropped.is_set()
    assert_clean_log(chaos.log_from(offset))


def test_a_result_redis_refuses_is_not_acknowledged_and_is_answered_once_later(chaos: Chaos) -> None:
    """While Redis refuses the publication (an ACL takes EVALSHA away from the worker), the call's message
    is logged and handed back to the queue, never acknowledged; once Redis accepts again, the call is
    answered, exactly once, and nothing stays held."""
    offset = chaos.log_size()
    token = uuid.uuid4().hex
    stream = f"chaos:replies:{uuid.uuid4().hex}"
    message = {"callId": token, "tool": "hostile_get", "arguments": {"case": f"echo-{token}"}, "replyTo": stream}
    chaos.redis.execute_command("ACL", "SETUSER", "default", "-evalsha")
    try:
        chaos.redis.lpush(DEFAULT_QUEUE, *task_messages([message], DEFAULT_QUEUE, 1))
        wait_until(lambda: chaos.log_from(offset).count("call.publish_failed") >= 2, 30, "two refused publications")
    finally:
        chaos.redis.execute_command("ACL", "SETUSER", "default", "+evalsha")
    wait_until(lambda: chaos.redis.xlen(stream) >= 1, ANSWER_WITHIN_S, "the envelope once Redis accepts it")
    wait_until(lambda: held(chaos.redis) == 0, ANSWER_WITHIN_S, "nothing held")
    entries: Any = chaos.redis.xrange(stream)
    envelopes = [json.loads(data[b"envelope"]) for _, data in entries]
    assert [(e["callId"], e["exitCode"], e["result"]) for e in envelopes] == [(token, 0, token)]
    log = chaos.log_from(offset)
    assert any(event.get("callId") == token for event in log_events(log)) and "NoPermissionError" in log
    assert_clean_log(log)
    assert_answers_its_own_calls(chaos)
