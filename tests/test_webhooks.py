"""Webhooks end to end: real Redis-compatible servers, real worker (and gateway) processes, a local receiver
that verifies each delivery with the `standardwebhooks` package's own verifier."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
import redis.asyncio as aioredis

from tests.conftest import FIXTURES, Upstream, start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver, ReceiverServer
from worker.client import ToolClient
from worker.constants import DEAD_LETTER_KEY, DEFAULT_QUEUE
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.errors import CallbackRefused
from worker.protocol import task_message
from worker.queue.webhooks import DUE_KEY, RECORD_PREFIX, requeue, sign, webhook_id
from worker.settings import get_settings

pytestmark = pytest.mark.integration

OLD_SECRET = "whsec_" + base64.b64encode(b"the old key of the webhooks 0001").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"the new key of the webhooks 0002").decode()
REFUSED_HOST = "refused.test"  # the test DNS server answers 127.0.0.2: allow-listed by name, refused by address


@dataclass
class HookStack:
    """A Redis of its own, a worker, the receiver; more workers can be started on the same Redis."""

    redis: EmbeddedRedis
    env: dict[str, str]
    receiver: Receiver
    directory: Path
    workers: list[subprocess.Popen[bytes]]

    def start_worker(self) -> subprocess.Popen[bytes]:
        process = start_worker(self.env, self.directory / f"worker-{len(self.workers)}.log")
        self.workers.append(process)
        with ToolClient(self.redis.url) as client:
            warm = client.call("echo_get", {"item": "warm"}, timeout=60)
        assert warm.exit_code == 0, self.log_text()[-3000:]
        return process

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.directory.glob("worker-*.log")))

    def letters(self) -> list[dict[str, Any]]:
        client = redis.Redis.from_url(self.redis.url)
        try:
            return [json.loads(raw) for raw in client.lrange(DEAD_LETTER_KEY, 0, -1)]
        finally:
            client.close()

    def stored_text(self) -> bytes:
        """Every value of every key of this Redis, concatenated (to look for what must not be there)."""
        client = redis.Redis.from_url(self.redis.url)
        readers: dict[bytes, Any] = {
            b"string": lambda k: [client.get(k)],
            b"hash": lambda k: [b for kv in client.hgetall(k).items() for b in kv],
            b"list": lambda k: client.lrange(k, 0, -1),
            b"set": lambda k: list(client.smembers(k)),
            b"zset": lambda k: client.zrange(k, 0, -1),
            b"stream": lambda k: [b for _, fields in client.xrange(k) for kv in fields.items() for b in kv],
        }
        parts: list[bytes] = []
        try:
            for key in client.scan_iter(count=1000):
                parts += [key, *(v for v in readers[client.type(key)](key) if isinstance(v, bytes))]
        finally:
            client.close()
        return b"".join(parts)

    def pending(self) -> tuple[int, int]:
        """Entries in the due set, and delivery records."""
        client = redis.Redis.from_url(self.redis.url)
        try:
            return int(client.zcard(DUE_KEY)), len(list(client.scan_iter(match=RECORD_PREFIX + "*")))
        finally:
            client.close()


@pytest.fixture(scope="module")
def dns() -> Iterator[DnsServer]:
    server = DnsServer({REFUSED_HOST: ["127.0.0.2"]}).start()
    yield server
    server.stop()


def make_stack(
    directory: Path, upstream: Upstream, dns: DnsServer, receiver: Receiver, **extra: str
) -> tuple[HookStack, ReceiverServer]:
    server = EmbeddedRedis(directory / "redis").start()
    env = worker_env(server.url, upstream.url, dns.address, FIXTURES / "integration")
    env.update(
        TOOLWORKER_CALLBACK_ALLOW=f"127.0.0.1 {REFUSED_HOST}",
        TOOLWORKER_CALLBACK_SECRET=f"{OLD_SECRET} {NEW_SECRET}",
        TOOLWORKER_CALLBACK_RETRY_SECONDS="60",
        TOOLWORKER_CALLBACK_TIMEOUT_SECONDS="3",
    )
    env.update(extra)
    return HookStack(server, env, receiver, directory, []), ReceiverServer(receiver)


def close_stack(stack: HookStack, receiver: ReceiverServer) -> None:
    for process in stack.workers:
        if process.poll() is None:
            stop_worker(process)
    receiver.stop()
    stack.redis.stop()


@pytest.fixture(scope="module")
def hooks(upstream: Upstream, dns: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HookStack]:
    """One worker whose callbacks may reach the receiver on 127.0.0.1 (and refused.test, by name)."""
    receiver = Receiver([OLD_SECRET, NEW_SECRET], free_port())
    stack, server = make_stack(tmp_path_factory.mktemp("hooks"), upstream, dns, receiver)
    server.start()
    try:
        stack.start_worker()
        yield stack
    finally:
        close_stack(stack, server)


@pytest.fixture
def allow_callbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process (the client) allows callbacks to the receiver too."""
    monkeypatch.setenv("TOOLWORKER_CALLBACK_ALLOW", f"127.0.0.1 {REFUSED_HOST}")


def test_the_signature_is_the_standard_one_per_secret() -> None:
    """One `v1,` signature per key, space-separated, over id.timestamp.body (the package verifies each)."""
    from standardwebhooks import Webhook

    keys = [base64.b64decode(s[len("whsec_") :]) for s in (OLD_SECRET, NEW_SECRET)]
    header = sign(keys, "msg_1", 1_700_000_000, b'{"a": 1}')
    assert len(header.split(" ")) == 2 and all(part.startswith("v1,") for part in header.split(" "))
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(time.time())), "webhook-signature": ""}
    headers["webhook-signature"] = sign(keys[1:], "msg_1", int(headers["webhook-timestamp"]), b"{}")
    assert Webhook(NEW_SECRET).verify(b"{}", headers) == {}
    assert webhook_id("abc-1") == "msg_abc-1" and webhook_id("a b\n").startswith("msg_")


def test_client_callback_url_delivers_the_signed_envelope(hooks: HookStack, allow_callbacks: None) -> None:
    """`callback_url=` on call: the envelope arrives once, signed with both secrets (a rotation), its
    webhook-id derived from the callId, its body the envelope the caller got."""
    with ToolClient(hooks.redis.url) as client:
        result = client.call("echo_get", {"item": "hooked"}, timeout=30, callback_url=hooks.receiver.url("basic"))
    assert result.exit_code == 0
    wait_until(lambda: hooks.receiver.accepted("basic"), 30, "the delivery")
    (delivery,) = hooks.receiver.to("basic")
    assert delivery.verified == [True, True]  # a verifier holding either secret accepts it
    assert delivery.headers["webhook-id"] == f"msg_{result.call_id}"
    assert abs(int(delivery.headers["webhook-timestamp"]) - time.time()) < 60
    assert json.loads(delivery.body) == result.to_dict()
    wait_until(lambda: hooks.pending() == (0, 0), 10, "the record deleted")
    wait_until(lambda: "webhook.delivered" in hooks.log_text(), 10, "the delivery logged")
    log, stored = hooks.log_text(), hooks.stored_text()
    assert OLD_SECRET[6:] not in log and NEW_SECRET[6:] not in log
    assert result.call_id.encode() in stored  # the scan reads what Redis holds
    assert OLD_SECRET[6:].encode() not in stored and NEW_SECRET[6:].encode() not in stored


def test_submit_and_many_calls_each_deliver(hooks: HookStack, allow_callbacks: None) -> None:
    """`submit(callback_url=)` and `call_many(callback_url=)`: every call's envelope is delivered once."""
    url = hooks.receiver.url("many")
    with ToolClient(hooks.redis.url) as client:
        handle = client.submit("echo_get", {"item": "one"}, timeout=30, callback_url=url)
        results = client.call_many([("echo_get", {"item": str(i)}) for i in range(3)], timeout=30, callback_url=url)
        results.append(handle.get(30))
    wait_until(lambda: len(hooks.receiver.accepted("many")) == 4, 30, "four deliveries")
    ids = sorted(d.headers["webhook-id"] for d in hooks.receiver.to("many"))
    assert ids == sorted(f"msg_{r.call_id}" for r in results)


def test_a_raw_message_with_a_callback_is_delivered(hooks: HookStack) -> None:
    """A call LPUSHed by hand (no client) with `callback: {url}` gets its envelope delivered."""
    call_id = str(uuid.uuid4())
    call = {"callId": call_id, "tool": "echo_get", "arguments": {"item": "raw"}}
    call["callback"] = {"url": hooks.receiver.url("raw")}
    client = redis.Redis.from_url(hooks.redis.url)
    try:
        client.lpush(DEFAULT_QUEUE, task_message(call_id, [call], DEFAULT_QUEUE))
    finally:
        client.close()
    wait_until(lambda: hooks.receiver.accepted("raw"), 30, "the delivery")
    envelope = json.loads(hooks.receiver.to("raw")[0].body)
    assert envelope["callId"] == call_id and envelope["exitCode"] == 0


def test_a_raw_message_with_a_refused_callback_gets_an_error_envelope(hooks: HookStack) -> None:
    """A raw call whose callback host is not allowed is answered exit 77 and nothing is POSTed."""
    call_id = str(uuid.uuid4())
    call = {"callId": call_id, "tool": "echo_get", "arguments": {}, "callback": {"url": "http://elsewhere.test/x"}}
    client = redis.Redis.from_url(hooks.redis.url)
    try:
        client.lpush(DEFAULT_QUEUE, task_message(call_id, [call], DEFAULT_QUEUE))
    finally:
        client.close()
    with ToolClient(hooks.redis.url) as tool_client:
        result = tool_client._run(tool_client._async.result(call_id, 30), 30)
    assert result.exit_code == 77 and "callback" in (result.error or {})["message"].lower()
    assert hooks.pending() == (0, 0)


def test_the_client_refuses_a_callback_the_allow_list_does_not_name(hooks: HookStack, monkeypatch: Any) -> None:
    """With TOOLWORKER_CALLBACK_ALLOW empty every callback is refused at enqueue; else an unlisted host is."""
    with ToolClient(hooks.redis.url) as client:
        with pytest.raises(CallbackRefused, match="TOOLWORKER_CALLBACK_ALLOW is empty"):
            client.call("echo_get", {}, timeout=10, callback_url=hooks.receiver.url("never"))
        monkeypatch.setenv("TOOLWORKER_CALLBACK_ALLOW", "hooks.example.com")
        get_settings.cache_clear()
        with pytest.raises(CallbackRefused, match="not on the allow-list"):
            client.submit("echo_get", {}, timeout=10, callback_url=hooks.receiver.url("never"))
    assert hooks.receiver.to("never") == []


def test_a_name_allowed_but_resolving_to_a_refused_address_is_refused_at_connect(
    hooks: HookStack, allow_callbacks: None
) -> None:
    """refused.test is on the allow-list by name but resolves to 127.0.0.2: the connection is refused by the
    egress policy's address check, and the delivery is dead-lettered with that reason at once."""
    url = hooks.receiver.url("refused", host=REFUSED_HOST)
    with ToolClient(hooks.redis.url) as client:
        result = client.call("echo_get", {"item": "x"}, timeout=30, callback_url=url)
    assert result.exit_code == 0
    wait_until(lambda: any(e.get("callId") == result.call_id for e in hooks.letters()), 30, "the dead letter")
    letter = next(e for e in hooks.letters() if e.get("callId") == result.call_id)
    assert letter["kind"] == "webhook" and "loopback address" in letter["reason"]
    assert letter["url"] == url and letter["webhookId"] == f"msg_{result.call_id}"
    assert json.loads(letter["envelope"])["callId"] == result.call_id
    assert hooks.receiver.to("refused") == [] and "127.0.0.2" not in letter["reason"]
    text = json.dumps(hooks.letters())
    assert OLD_SECRET[6:] not in text and NEW_SECRET[6:] not in text


def test_rest_callback_is_delivered_and_a_refused_one_is_403(hooks: HookStack, tmp_path: Path) -> None:
    """POST /v1/calls with `callback`: delivered; a host the gateway's allow-list refuses is a 403 JSON error;
    a batch item with a refused callback gets its own error envelope."""
    env = gateway_env(hooks.redis.url, FIXTURES / "integration", TOOLWORKER_CALLBACK_ALLOW="127.0.0.1")
    gateway: Gateway = start_gateway(env, tmp_path / "gateway.log")
    try:
        wait_listening(gateway, ready=True)
        headers = {"Authorization": f"Bearer {env['TOOLWORKER_GATEWAY_TOKENS'].split(',')[0]}"}
        body = {"tool": "echo_get", "arguments": {"item": "rest"}, "callback": {"url": hooks.receiver.url("rest")}}
        answer = httpx2.post(gateway.url + "/v1/calls", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        wait_until(lambda: hooks.receiver.accepted("rest"), 30, "the delivery")
        assert json.loads(hooks.receiver.to("rest")[0].body)["callId"] == answer.json()["callId"]
        body["callback"] = {"url": "http://elsewhere.test/hook"}
        refused = httpx2.post(gateway.url + "/v1/calls", json=body, headers=headers, timeout=60)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "callback_refused"
        batch = httpx2.post(gateway.url + "/v1/batches", json={"calls": [body]}, headers=headers, timeout=60)
        assert batch.status_code == 200 and batch.json()["results"][0]["exitCode"] == 77
    finally:
        gateway.stop()


def test_a_receiver_down_then_failing_then_up_gets_it_once(
    upstream: Upstream, dns: DnsServer, tmp_path: Path, allow_callbacks: None
) -> None:
    """The receiver is down (connection refused), then answers 503, for about 10 s; then it accepts: the
    delivery arrives, is accepted once, and every attempt carried the same webhook-id."""
    receiver = Receiver([NEW_SECRET], free_port(), modes={"flaky": "fail"})
    stack, server = make_stack(tmp_path, upstream, dns, receiver)
    try:
        stack.start_worker()
        with ToolClient(stack.redis.url) as client:
            result = client.call("echo_get", {"item": "x"}, timeout=30, callback_url=receiver.url("flaky"))
        down_until = time.monotonic() + 5
        wait_until(lambda: time.monotonic() > down_until, 10, "five seconds down")
        server.start()
        wait_until(lambda: receiver.to("flaky"), 30, "an attempt on the receiver answering 503")
        failing_until = time.monotonic() + 5
        wait_until(lambda: time.monotonic() > failing_until, 10, "five seconds of 503")
        receiver.modes["flaky"] = "accept"
        wait_until(lambda: receiver.accepted("flaky"), 60, "the delivery")
        wait_until(lambda: stack.pending() == (0, 0), 10, "the record deleted")
        assert len(receiver.accepted("flaky")) == 1
        assert {d.headers["webhook-id"] for d in receiver.to("flaky")} == {f"msg_{result.call_id}"}
        assert all(d.status == 503 for d in receiver.to("flaky")[:-1])
        assert stack.letters() == []
    finally:
        close_stack(stack, server)


def test_an_always_failing_receiver_is_given_up_after_the_window(
    upstream: Upstream, dns: DnsServer, tmp_path: Path, allow_callbacks: None
) -> None:
    """With a 4 s retry window, a receiver that always answers 503 sees no attempt after the window, and the
    delivery becomes a dead letter naming the reason, which a replay delivers."""
    window_s = 4.0
    receiver = Receiver([NEW_SECRET], free_port(), modes={"broken": "fail"})
    stack, server = make_stack(tmp_path, upstream, dns, receiver, TOOLWORKER_CALLBACK_RETRY_SECONDS=str(window_s))
    server.start()
    try:
        stack.start_worker()
        with ToolClient(stack.redis.url) as client:
            result = client.call("echo_get", {"item": "x"}, timeout=30, callback_url=receiver.url("broken"))
        wait_until(lambda: stack.letters(), 30, "the dead letter")
        (letter,) = stack.letters()
        assert letter["callId"] == result.call_id and "HTTP 503" in letter["reason"]
        assert "retry window" in letter["reason"] and letter["attempts"] == len(receiver.to("broken")) >= 2
        first = letter["firstAttemptAt"]
        assert all(d.at <= first + window_s + 1.0 for d in receiver.to("broken"))
        assert stack.pending() == (0, 0)  # nothing left that could be attempted again
        # A replay of the dead letter (what `requeue` does) delivers it, with the same webhook-id.
        receiver.modes["broken"] = "accept"
        asyncio.run(_requeue(stack.redis.url, letter))
        wait_until(lambda: receiver.accepted("broken"), 30, "the replayed delivery")
        assert receiver.accepted("broken")[0].headers["webhook-id"] == f"msg_{result.call_id}"
    finally:
        close_stack(stack, server)


async def _requeue(redis_url: str, letter: dict[str, Any]) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        await requeue(client, letter)
    finally:
        await client.aclose()


def test_a_worker_killed_during_delivery_loses_nothing(
    upstream: Upstream, dns: DnsServer, tmp_path: Path, allow_callbacks: None
) -> None:
    """The receiver holds the first delivery open; its worker is killed (-9); another worker delivers it,
    with the same webhook-id, accepted once."""
    receiver = Receiver([NEW_SECRET], free_port(), modes={"held": "hold_first"})
    stack, server = make_stack(tmp_path, upstream, dns, receiver, TOOLWORKER_CALLBACK_TIMEOUT_SECONDS="8")
    server.start()
    try:
        first = stack.start_worker()
        with ToolClient(stack.redis.url) as client:
            result = client.call("echo_get", {"item": "x"}, timeout=30, callback_url=receiver.url("held"))
        wait_until(lambda: receiver.to("held"), 30, "the held delivery")
        first.kill()
        first.wait(10)
        stack.start_worker()
        # The first worker's claim (8 s + 5 s) lapses; then the second delivers.
        wait_until(lambda: receiver.accepted("held"), 90, "the delivery by the second worker")
        wait_until(lambda: stack.pending() == (0, 0), 10, "the record deleted")
        assert len(receiver.accepted("held")) == 1
        assert {d.headers["webhook-id"] for d in receiver.to("held")} == {f"msg_{result.call_id}"}
    finally:
        close_stack(stack, server)
