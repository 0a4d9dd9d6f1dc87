"""Real processes for the vault's tests: a Redis, oidc-provider (authorization code + PKCE, rotated refresh
tokens, revocation, token exchange), a protected upstream that validates its JWTs and echoes `sub`, two
workers and a gateway; and a scripted browser that follows a connect link, logs in and consents."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.oidc import OidcClient, OidcServer
from tests.support.protected import Guarded, protected_upstream
from tests.support.servers import DnsServer, ServerThread
from worker.dev.embedded import EmbeddedRedis, free_port

VAULT_KEY = "k1:" + base64.b64encode(b"v" * 32).decode()
PEOPLE_SECRET = "people-secret-0123456789abcdef"
EXCHANGE_SECRET = "exchange-secret-0123456789abcdef"
USERS = ("alice", "bob", "carol", "dave", "eve", "frank", "grace", "henry", "ivy", "judy", "kate", "leo", "mia")
ALICE_TOKEN, BOB_TOKEN, CAROL_TOKEN, DAVE_TOKEN, EVE_TOKEN, FRANK_TOKEN, GRACE_TOKEN = (
    f"{n}-static-token-0123456789" for n in USERS[:7]
)
KATE_TOKEN = "kate-static-token-0123456789"
AGENT = OidcClient("agent-x", "agent-secret-0123456789abcdef", "tools.all", "default")
ACCESS_TOKEN_TTL_S = 4  # short: calls across a few seconds see several refreshes
ACCESS = """
tokens:
{tokens}
oauth:
  issuer: {issuer}
  scopes: {{tools.all: {{tools: ["*"]}}}}
"""
DEFINITIONS = """
upstreams:
  people:
    base_url: ${{env:TEST_UPSTREAM_URL}}
    timeout_seconds: 10
    auth:
      type: oauth2_user
      issuer: {issuer}
      client_id: people-app
      client_secret: ${{env:TEST_PEOPLE_SECRET}}
      scopes: [openid, offline_access, people.read]
      extra_params: {{resource: "{resource}"}}
  people_limited:
    # The same API behind a rate limit: calls wait for their slot after they took the user's token.
    base_url: ${{env:TEST_UPSTREAM_URL}}
    timeout_seconds: 10
    rate_limit: {{per_second: 6, burst: 1}}
    auth:
      type: oauth2_user
      issuer: {issuer}
      client_id: people-app
      client_secret: ${{env:TEST_PEOPLE_SECRET}}
      scopes: [openid, offline_access, people.read]
      extra_params: {{resource: "{resource}"}}
  people_exchanged:
    base_url: ${{env:TEST_UPSTREAM_URL}}
    timeout_seconds: 10
    auth:
      type: oauth2_token_exchange
      token_url: {issuer}/token
      client_id: exchanger
      client_secret: ${{env:TEST_EXCHANGE_SECRET}}
      audience: "{resource}"
      scopes: [people.read]
tools:
  - name: whoami
    upstream: people
    description: Who the upstream says the user is.
    input_schema: {{type: object, properties: {{}}}}
    request: {{method: GET, path: /me}}
  - name: whoami_limited
    upstream: people_limited
    description: Who the upstream says the user is, within its rate limit.
    input_schema: {{type: object, properties: {{}}}}
    request: {{method: GET, path: /me}}
  - name: whoami_exchanged
    upstream: people_exchanged
    description: Who the upstream says the caller is, with an exchanged token.
    input_schema: {{type: object, properties: {{}}}}
    request: {{method: GET, path: /me}}
"""


@dataclass
class VaultStack:
    redis: EmbeddedRedis
    oidc: OidcServer
    guarded: Guarded
    gateway: Gateway
    directory: Path
    worker_logs: list[Path]
    env: dict[str, str]

    @property
    def url(self) -> str:
        return self.gateway.url

    def logs(self) -> str:
        texts = [p.read_text(errors="replace") for p in [*self.worker_logs, self.gateway.log_path]]
        return "\n".join(texts)


def consent(link: str, login: str) -> httpx2.Response:
    """A scripted browser: open the connect link, log in as `login` and allow; the gateway's last page."""
    with httpx2.Client(follow_redirects=True, timeout=20) as browser:
        page = browser.get(link)
        assert page.status_code == 200 and "/interaction/" in str(page.url), (page.status_code, page.text[:500])
        uid = re.search(r"/interaction/([^/?#]+)", str(page.url))
        assert uid is not None
        return browser.post(
            str(page.url).split("/interaction/")[0] + f"/interaction/{uid.group(1)}", data={"login": login}
        )


def link_in(text: str) -> str:
    found = re.search(r"https?://\S+/v1/connections/\S+/authorize\?ticket=[A-Za-z0-9_-]+", text)
    assert found is not None, text
    return found.group(0)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def vault_stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultStack]:
    directory = tmp_path_factory.mktemp("vault")
    redis = EmbeddedRedis(directory / "redis").start()
    gateway_port = free_port()
    public = f"http://127.0.0.1:{gateway_port}"
    guarded = Guarded(issuer="")
    upstream = ServerThread(protected_upstream(guarded)).start()
    resource = upstream.url + "/"
    extra = {
        "upstream": {"resource": resource, "scope": "people.read", "accessTokenTTL": ACCESS_TOKEN_TTL_S},
        "userClients": [
            {
                "client_id": "people-app",
                "client_secret": PEOPLE_SECRET,
                "redirect_uris": [public + "/v1/connections/callback"],
            }
        ],
        "exchangeClients": [{"client_id": "exchanger", "client_secret": EXCHANGE_SECRET}],
    }
    oidc = OidcServer(directory, public + "/mcp", [AGENT], extra=extra)
    workers, gateway = [], None
    try:
        oidc.start()
        guarded.issuer, guarded.audience = oidc.issuer, resource
        definitions = directory / "definitions"
        definitions.mkdir()
        (definitions / "people.yaml").write_text(DEFINITIONS.format(issuer=oidc.issuer, resource=resource))
        access = directory / "access.yaml"
        tokens = "\n".join(f'  {n}: {{token: "{n}-static-token-0123456789", tools: ["*"]}}' for n in USERS)
        access.write_text(ACCESS.format(issuer=oidc.issuer, tokens=tokens))
        shared = dict(
            TOOLWORKER_VAULT_KEYS=VAULT_KEY,
            TOOLWORKER_GATEWAY_PUBLIC_URL=public,
            TEST_PEOPLE_SECRET=PEOPLE_SECRET,
            TEST_EXCHANGE_SECRET=EXCHANGE_SECRET,
        )
        env = {**worker_env(redis.url, upstream.url, dns_server.address, definitions), **shared}
        logs = [directory / "worker-1.log", directory / "worker-2.log"]
        workers = [start_worker(env, log) for log in logs]
        genv = gateway_env(redis.url, definitions, TOOLWORKER_GATEWAY_ACCESS=str(access), **shared)
        genv.pop("TOOLWORKER_GATEWAY_TOKENS")
        gateway = start_gateway(genv, directory / "gateway.log", gateway_port)
        wait_listening(gateway, ready=True)
        yield VaultStack(redis, oidc, guarded, gateway, directory, logs, env)
    finally:
        if gateway is not None:
            gateway.stop()
        for worker in workers:
            stop_worker(worker)
        oidc.stop()
        upstream.stop()
        redis.stop()


__all__ = ["VaultStack", "bearer", "consent", "link_in", "vault_stack"]
