"""`make run`'s demo of acting for a user: the demo's own authorization server (worker/dev/authserver.py),
the `my_profile` tool of definitions/demo.yaml, a worker and a gateway without tokens (the local user)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer, ServerThread
from worker.dev.demo import make_app
from worker.dev.embedded import EmbeddedRedis, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
DEFINITIONS = Path(__file__).parent.parent / "definitions"


@pytest.fixture(scope="module")
def demo_gateway(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("vault-demo")
    redis = EmbeddedRedis(directory / "redis").start()
    demo = ServerThread(make_app()).start()
    port = free_port()
    shared = dict(
        TOOLWORKER_DEMO_URL=demo.url,
        TOOLWORKER_VAULT_KEYS="dev:" + base64.b64encode(b"d" * 32).decode(),
        TOOLWORKER_GATEWAY_PUBLIC_URL=f"http://127.0.0.1:{port}",
    )
    worker = start_worker(
        {**worker_env(redis.url, demo.url, dns_server.address, DEFINITIONS), **shared}, directory / "w.log"
    )
    env = gateway_env(redis.url, DEFINITIONS, **shared)
    env.pop("TOOLWORKER_GATEWAY_TOKENS")  # like `make run`: loopback only, the local user
    gateway = start_gateway(env, directory / "gateway.log", port)
    try:
        wait_listening(gateway, ready=True)
        yield gateway
    finally:
        gateway.stop()
        stop_worker(worker)
        demo.stop()
        redis.stop()


def test_the_demo_asks_for_consent_then_acts_for_the_user(demo_gateway: Gateway) -> None:
    """The first `my_profile` call is 67 with a link; the demo's consent page (a user name, Allow) connects
    it, and the call then reads that user's profile."""
    call = {"tool": "my_profile", "arguments": {}}
    first = httpx2.post(demo_gateway.url + "/v1/calls", json=call, timeout=60).json()
    assert first["exitCode"] == 67, first
    link = re.search(r"http://\S+/authorize\?ticket=\S+", first["error"]["message"])
    assert link is not None
    with httpx2.Client(follow_redirects=True, timeout=20) as browser:
        page = browser.get(link.group(0))
        fields = dict(re.findall(r"name='([^']+)' value='([^']*)'", page.text))
        done = browser.post(str(page.url), data={**fields, "login": "newcomer"})
    assert done.status_code == 200 and "Connected demo_profile" in done.text, done.text
    second = httpx2.post(demo_gateway.url + "/v1/calls", json=call, timeout=60).json()
    assert second["exitCode"] == 0, second
    assert json.loads(second["result"])["user"] == "newcomer"
