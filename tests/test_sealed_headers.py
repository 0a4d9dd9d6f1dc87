"""Per-call credentials under vault keys, through real processes (a Redis-compatible server, a gateway, two
workers, a recording upstream): a call's headers are sealed on the queue, in a parked call and after the
call; only the worker that sends the call opens them, and the upstream receives them."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import redis

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, Recorder, auth, gateway_env, recording_upstream, start_gateway
from tests.support.gateway_stack import wait_listening as wait_gateway
from tests.support.redis_scan import holders
from tests.support.servers import DnsServer, ServerThread, UpstreamState
from tests.support.vault_stack import VAULT_KEY
from tests.support.waiting import scaled, wait_until
from worker.dev.embedded import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
USER_TOKEN = "user-own-token-5e0c7a91"
SESSION_KEY = "session-key-value-b24d18"
SECRETS = (USER_TOKEN, SESSION_KEY)
LATER_QUEUE = "sealed-later"
DEFINITIONS = f"""
upstreams:
  keyed:
    base_url: ${{env:TEST_UPSTREAM_URL}}
    timeout_seconds: 5
    overridable_headers: [X-Session-Key]
    auth: {{type: bearer, per_call_header: X-User-Token}}
  keyed_later:
    # No worker takes this queue until the test starts one: its call waits, enqueued.
    base_url: ${{env:TEST_UPSTREAM_URL}}
    queue: {LATER_QUEUE}
    timeout_seconds: 5
    overridable_headers: [X-Session-Key]
    auth: {{type: bearer, per_call_header: X-User-Token}}
tools:
  - name: seen_approved
    upstream: keyed
    description: Needs approval.
    approval: always
    input_schema: {{type: object, properties: {{item: {{type: string}}}}, required: [item]}}
    request: {{method: GET, path: "/seen/approved/${{item}}"}}
  - name: seen_later
    upstream: keyed_later
    description: Waits on its queue.
    input_schema: {{type: object, properties: {{item: {{type: string}}}}, required: [item]}}
    request: {{method: GET, path: "/seen/later/${{item}}"}}
"""


@dataclass
class SealedStack:
    redis: EmbeddedRedis
    recorder: Recorder
    gateway: Gateway
    worker_env: dict[str, str]
    directory: Path

    def exposed(self) -> list[bytes]:
        """The Redis keys whose value shows a secret (in the clear or base64)."""
        client = redis.Redis.from_url(self.redis.url)
        try:
            return sorted({key for secret in SECRETS for key in holders(client, secret)})
        finally:
            client.close()


@pytest.fixture
def stack(dns_server: DnsServer, tmp_path: Path) -> Iterator[SealedStack]:
    """A Redis, the recording upstream, a worker of the default queue and a gateway, all with vault keys."""
    definitions = tmp_path / "definitions"
    definitions.mkdir()
    (definitions / "tools.yaml").write_text(DEFINITIONS)
    server = EmbeddedRedis(tmp_path / "redis").start()
    recorder = Recorder()
    upstream = ServerThread(recording_upstream(UpstreamState(), recorder)).start()
    env = worker_env(server.url, upstream.url, dns_server.address, definitions) | {"TOOLWORKER_VAULT_KEYS": VAULT_KEY}
    worker = start_worker(env, tmp_path / "worker.log")
    gateway = None
    try:
        extra = {"TOOLWORKER_VAULT_KEYS": VAULT_KEY}
        gateway = start_gateway(gateway_env(server.url, definitions, **extra), tmp_path / "gateway.log")
        wait_gateway(gateway, ready=True)
        yield SealedStack(server, recorder, gateway, env, tmp_path)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


def test_the_scan_finds_a_secret_in_every_kind_of_value(stack: SealedStack) -> None:
    """The scan reads strings, lists, hashes, sets, sorted sets and streams, in the clear and in base64."""
    client = redis.Redis.from_url(stack.redis.url)
    hidden = base64.b64encode(f'{{"h": "{USER_TOKEN}"}}'.encode()).decode()
    client.set("k-string", f"x{SESSION_KEY}x")
    client.rpush("k-list", "a", hidden)
    client.hset("k-hash", "f", hidden)
    client.sadd("k-set", USER_TOKEN)
    client.zadd("k-zset", {hidden: 1})
    client.xadd("k-stream", {"v": SESSION_KEY})
    names = [b"k-hash", b"k-list", b"k-set", b"k-stream", b"k-string", b"k-zset"]
    try:
        assert [key for key in stack.exposed() if key.startswith(b"k-")] == names
    finally:
        client.delete(*names)
        client.close()


def test_call_headers_are_sealed_when_queued_parked_and_after_the_call(stack: SealedStack) -> None:
    """A user's token (per_call_header) and a secret-named header are in no Redis value after enqueue, after
    parking, nor after the calls; the upstream received both, from the worker that opened them."""
    headers = {**auth(), "X-User-Token": USER_TOKEN, "X-Session-Key": SESSION_KEY}
    item = uuid.uuid4().hex[:10]

    def post(tool: str) -> str:
        # Each waits for a worker started later: its deadline stretches with the machine's load (a worker's
        # start took 28-48 s on a busy 2-core machine, past the gateway's default of 20 s).
        body = {"tool": tool, "arguments": {"item": item}, "wait": False, "timeoutSeconds": round(scaled(60))}
        answer = httpx2.post(f"{stack.gateway.url}/v1/calls", json=body, headers=headers, timeout=60)
        assert answer.status_code == 202, answer.text
        return str(answer.json()["callId"])

    later = post("seen_later")
    queue = redis.Redis.from_url(stack.redis.url)
    assert any(b"sealedHeaders" in message for message in queue.lrange(LATER_QUEUE, 0, -1))
    assert stack.exposed() == []  # enqueued
    parked = post("seen_approved")
    approvals = f"{stack.gateway.url}/v1/approvals"
    wait_until(lambda: parked in httpx2.get(approvals, headers=auth(), timeout=30).text, 30, "the call parked")
    assert stack.exposed() == []  # parked
    decided = httpx2.post(f"{approvals}/{parked}", json={"decision": "approve"}, headers=auth(), timeout=30)
    assert decided.status_code == 200, decided.text
    later_worker = start_worker(stack.worker_env, stack.directory / "later.log", "-Q", LATER_QUEUE)
    try:
        for call_id in (parked, later):
            answer = httpx2.get(f"{stack.gateway.url}/v1/calls/{call_id}?waitSeconds=30", headers=auth(), timeout=60)
            assert answer.status_code == 200 and answer.json()["exitCode"] == 0, answer.text
    finally:
        stop_worker(later_worker)
    seen = [h for h in stack.recorder.seen if h.get("x-session-key") == SESSION_KEY]
    assert [h["authorization"] for h in seen] == [f"Bearer {USER_TOKEN}"] * 2
    assert stack.exposed() == []  # after the calls
    logs = [stack.directory / name for name in ("worker.log", "later.log", "gateway.log")]
    assert not any(secret in log.read_text(errors="replace") for log in logs for secret in SECRETS)
