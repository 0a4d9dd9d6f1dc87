"""The operators' console in a real headless browser (Debian's chromium through Playwright), against a real
gateway, worker, Redis and upstream; CSRF and Origin refusals with a plain HTTP client."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from playwright.sync_api import Page

from tests.conftest import FIXTURES, SECRET_TOKEN, start_worker, stop_worker, worker_env
from tests.support.browser import browser, page, screenshot_dir
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from tests.support.waiting import wait_until
from worker.constants import DEAD_LETTER_KEY, DEFAULT_QUEUE, RESULT_KEY_PREFIX
from worker.dev.embedded import EmbeddedRedis, free_port

pytestmark = pytest.mark.integration
__all__ = ["browser", "page"]

OPS_TOKEN = "ops-console-token-5b1c9e"
VIEWER_TOKEN = "viewer-token-77aa01"
APPROVER_TOKEN = "approver-token-0c4e7d"
ALPHA_TOKEN = "alpha-token-31f0"
BETA_TOKEN = "beta-token-a9d2"
LEGACY_TOKEN = "legacy-gateway-token-4410"
HEADER_SECRET = "dead-letter-header-secret-90210"
DEFINITIONS = FIXTURES / "console"
ACCESS = f"""
tokens:
  ops: {{token: "{OPS_TOKEN}", tools: ["*"], grants: [operate]}}
  approver: {{token: "{APPROVER_TOKEN}", tools: ["*"], grants: [operate, approve]}}
  viewer: {{token: "{VIEWER_TOKEN}", tools: ["*"]}}
  alpha: {{token: "{ALPHA_TOKEN}", tenant: alpha, tools: ["*"]}}
  beta: {{token: "{BETA_TOKEN}", tenant: beta, tools: ["*"]}}
"""


@dataclass
class ConsoleStack:
    gateway: Gateway
    redis_url: str
    env: dict[str, str]
    upstream: UpstreamState

    @property
    def url(self) -> str:
        return self.gateway.url

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "worker", *args]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)


@pytest.fixture(scope="module")
def console(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    """A Redis, a worker, an upstream and a gateway with an access file (ops may operate, viewer may not)."""
    directory = tmp_path_factory.mktemp("console")
    server = EmbeddedRedis(directory / "redis").start()
    state = UpstreamState()
    upstream = ServerThread(make_upstream(state)).start()
    env = worker_env(server.url, upstream.url, dns_server.address, DEFINITIONS)
    worker = start_worker(env, directory / "worker.log")
    access = directory / "access.yaml"
    access.write_text(ACCESS)
    port = free_port()
    gateway = None
    try:
        published = subprocess.run(
            [sys.executable, "-m", "worker", "publish"], env=env, capture_output=True, text=True, timeout=60
        )
        assert published.returncode == 0, published.stderr  # the held queue is then a routed queue
        extra = {"TOOLWORKER_GATEWAY_ACCESS": str(access), "TOOLWORKER_GATEWAY_PUBLIC_URL": f"http://127.0.0.1:{port}"}
        genv = gateway_env(server.url, DEFINITIONS, TOOLWORKER_GATEWAY_TOKENS=LEGACY_TOKEN, **extra)
        gateway = start_gateway(genv, directory / "gateway.log", port)
        wait_listening(gateway, ready=True)
        yield ConsoleStack(gateway, server.url, env, state)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


# --- helpers ----------------------------------------------------------------------------------------


def sign_in(page: Page, stack: ConsoleStack, token: str = OPS_TOKEN) -> None:
    page.goto(stack.url + "/console/login")
    page.get_by_label("Token").fill(token)
    page.get_by_label("Token").press("Enter")


def table_rows(page: Page, selector: str = "table") -> list[list[str]]:
    rows = page.locator(f"{selector} tbody tr")
    return [[cell.strip() for cell in rows.nth(i).locator("td").all_inner_texts()] for i in range(rows.count())]


@contextmanager
def http_session(stack: ConsoleStack, token: str = OPS_TOKEN) -> Iterator[tuple[httpx2.Client, str]]:
    """An HTTP client signed in as a browser would be: its cookies, and the session's CSRF token."""
    with httpx2.Client(base_url=stack.url, timeout=30) as client:
        yield _signed_in(client, stack, token)


def _signed_in(client: httpx2.Client, stack: ConsoleStack, token: str) -> tuple[httpx2.Client, str]:
    form = client.get("/console/login")
    login_csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert login_csrf is not None
    signed = client.post(
        "/console/login", data={"csrf_token": login_csrf.group(1), "token": token}, headers={"Origin": stack.url}
    )
    assert signed.status_code == 303, signed.text
    fleet = client.get("/console/fleet")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', fleet.text)
    assert csrf is not None
    return client, csrf.group(1)


def every_value(r: redis.Redis) -> str:
    """Every key and value in Redis as text, to search for a secret."""
    readers: dict[str, Any] = {
        "string": lambda key: r.get(key),
        "list": lambda key: r.lrange(key, 0, -1),
        "hash": lambda key: r.hgetall(key),
        "set": lambda key: r.smembers(key),
        "zset": lambda key: r.zrange(key, 0, -1),
        "stream": lambda key: r.xrange(key),
    }
    parts = []
    for key in r.scan_iter(count=1000):
        read = readers.get(r.type(key).decode(), lambda key: b"")
        parts.append(f"{key!r} {read(key)!r}")
    return "\n".join(parts)


def poison(call_id: str, item: str) -> str:
    """A message for a task no worker knows, holding a call with a secret header: dead-lettered, unanswered."""
    call = {"callId": call_id, "tool": "echo_get", "arguments": {"item": item}, "headers": {"X-Secret": HEADER_SECRET}}
    return json.dumps(
        {
            "body": json.dumps([[call], {}, {}]),
            "content-type": "application/json",
            "content-encoding": "utf-8",
            "headers": {"lang": "py", "task": "not.a.task", "id": call_id},
            "properties": {"delivery_tag": call_id, "delivery_info": {"exchange": "", "routing_key": DEFAULT_QUEUE}},
        }
    )


def dead_letter_ids(r: redis.Redis) -> list[str]:
    return [json.loads(raw)["id"] for raw in r.lrange(DEAD_LETTER_KEY, 0, -1)]


def make_dead_letters(stack: ConsoleStack, count: int) -> list[tuple[str, str]]:
    """`count` dead letters holding calls: [(dead letter id, callId)], in the order pushed."""
    with stack.redis() as r:
        before = r.llen(DEAD_LETTER_KEY)
        call_ids = [f"dl-{uuid.uuid4().hex[:12]}" for _ in range(count)]
        for call_id in call_ids:
            r.lpush(DEFAULT_QUEUE, poison(call_id, call_id))
        wait_until(lambda: r.llen(DEAD_LETTER_KEY) == before + count, 30, "the dead letters")
        letters = [json.loads(raw) for raw in r.lrange(DEAD_LETTER_KEY, 0, count - 1)]
    by_call = {entry["calls"][0]["callId"]: entry["id"] for entry in letters}
    return [(by_call[call_id], call_id) for call_id in call_ids]


# --- signing in and out -----------------------------------------------------------------------------


def test_signing_in_lands_on_the_fleet_with_a_safe_cookie(console: ConsoleStack, page: Page) -> None:
    """The token signs in (Enter), the fleet page follows; the cookie is HttpOnly, SameSite=Strict, opaque,
    not Secure on plain http loopback, and printed nowhere."""
    sign_in(page, console)
    assert page.locator("h1").inner_text() == "Fleet"
    assert page.url.endswith("/console/fleet")
    [cookie] = [c for c in page.context.cookies() if c["name"] == "toolworker_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]
    assert cookie["value"] != OPS_TOKEN and OPS_TOKEN not in cookie["value"]
    for target in ("/console/fleet", "/console/catalog", "/console/dead-letters", "/console/audit"):
        page.goto(console.url + target)
        html = page.content()
        assert cookie["value"] not in html and OPS_TOKEN not in html
        nav = page.locator("nav a").all_inner_texts()
        assert nav == ["Fleet", "Catalog", "Upstreams", "Dead letters", "Audit", "Approvals"]
    csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
    assert csrf and csrf != cookie["value"]


def test_a_wrong_token_is_refused_and_sets_nothing(console: ConsoleStack, page: Page) -> None:
    """A wrong token shows an error, is not echoed, and sets no session cookie."""
    sign_in(page, console, "not-the-token-123456")
    assert "not valid" in page.locator("[role=alert]").inner_text()
    assert "not-the-token-123456" not in page.content()
    assert not [c for c in page.context.cookies() if c["name"] == "toolworker_console"]
    page.goto(console.url + "/console/fleet")
    assert page.locator("h1").inner_text() == "Sign in"


def test_a_principal_without_operate_gets_403(console: ConsoleStack, page: Page) -> None:
    """A valid token whose principal may not operate is refused with 403, and sets no session."""
    responses: list[int] = []
    page.on("response", lambda r: responses.append(r.status) if r.request.method == "POST" else None)
    sign_in(page, console, VIEWER_TOKEN)
    page.wait_for_load_state()
    assert responses == [403]
    assert not [c for c in page.context.cookies() if c["name"] == "toolworker_console"]


def test_pages_without_a_session_redirect_to_the_login(console: ConsoleStack) -> None:
    """Every console page without a session answers a 3xx to /console/login."""
    for target in (
        "/console",
        "/console/fleet",
        "/console/catalog",
        "/console/catalog/echo_get",
        "/console/dead-letters",
        "/console/dead-letters/x",
        "/console/audit",
    ):
        answer = httpx2.get(console.url + target, timeout=30)
        assert 300 <= answer.status_code < 400 and answer.headers["location"] == "/console/login", target


def test_a_legacy_gateway_token_may_operate(console: ConsoleStack) -> None:
    """A TOOLWORKER_GATEWAY_TOKENS token holds every action: it signs in."""
    with http_session(console, LEGACY_TOKEN) as (client, _):
        assert "<h1>Fleet</h1>" in client.get("/console/fleet").text


def test_signing_out_ends_the_session_on_the_server(console: ConsoleStack, page: Page) -> None:
    """Sign out removes the session in Redis: the old cookie value no longer opens a page."""
    sign_in(page, console)
    [cookie] = [c for c in page.context.cookies() if c["name"] == "toolworker_console"]
    page.get_by_role("button", name="Sign out").click()
    assert page.locator("h1").inner_text() == "Sign in"
    replayed = httpx2.get(console.url + "/console/fleet", cookies={"toolworker_console": cookie["value"]}, timeout=30)
    assert replayed.status_code == 303 and replayed.headers["location"] == "/console/login"


# --- pages against the CLI and Redis ----------------------------------------------------------------


def test_the_fleet_page_shows_what_toolworker_queue_prints(console: ConsoleStack, page: Page) -> None:
    """With calls waiting for three tenants, the fleet table holds the rows of `toolworker queue --format json`,
    and the worker's Celery node name."""
    for token, count in ((ALPHA_TOKEN, 3), (BETA_TOKEN, 2), (OPS_TOKEN, 1)):
        for n in range(count):
            body = {"tool": "held_echo", "arguments": {"item": f"fleet-{n}"}, "wait": False}
            sent = httpx2.post(console.url + "/v1/calls", json=body, headers={"Authorization": f"Bearer {token}"})
            assert sent.status_code == 202, sent.text
    sign_in(page, console)
    shown = table_rows(page, "#tenants")
    printed = json.loads(console.cli("queue", "--format", "json").stdout)
    expected = [[r["queue"], r["tenant"], str(r["waiting"]), str(r["queued"]), str(r["in_flight"])] for r in printed]
    assert [row[:5] for row in shown] == expected
    # the ages move between the two reads: both say a call of each held tenant waits, none of the others
    ages = {(r["queue"], r["tenant"]): r["oldest_waiting_s"] is not None for r in printed}
    assert {(row[0], row[1]): row[5] != "-" for row in shown} == ages
    held = {row[1]: int(row[3]) for row in shown if row[0] == "console-held"}
    assert held["alpha"] >= 3 and held["beta"] >= 2 and held["default"] >= 1
    headers = page.locator("#tenants thead th").all_inner_texts()
    assert {"Tenant", "Queued", "In flight"} <= set(headers)
    health = console.cli("health")
    node = health.stdout.split()[0]
    assert health.returncode == 0 and node in page.locator("table").first.inner_text()
    path = screenshot_dir() / "console-fleet.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def test_the_catalog_searches_shows_a_schema_and_tries_a_call(console: ConsoleStack, page: Page) -> None:
    """The catalog lists what `toolworker tools` does; search lists only matching tools; a tool's page shows
    its property descriptions; Try runs the call through the gateway and shows the finished envelope."""
    sign_in(page, console)
    page.get_by_role("link", name="Catalog").click()
    listed = json.loads(console.cli("tools", "--format", "json").stdout)
    assert [row[0] for row in table_rows(page)] == [tool["name"] for tool in listed]
    page.get_by_label("Search").fill("weather city forecast")
    page.get_by_label("Search").press("Enter")
    assert page.url.endswith("/console/catalog?q=weather+city+forecast")
    assert [row[0] for row in table_rows(page)] == ["weather_forecast"]
    path = screenshot_dir() / "console-catalog.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    page.get_by_role("link", name="weather_forecast").click()
    assert page.locator("h1").inner_text() == "weather_forecast"
    assert "The city whose weather is forecast." in page.content()
    page.get_by_label("Arguments").fill('{"city": "Lyon"}')
    page.get_by_role("button", name="Try").click()
    assert page.locator("#exit-code").inner_text() == "0"
    envelope = json.loads(page.locator("#envelope").inner_text())
    assert envelope["exitCode"] == 0 and "/echo/weather/Lyon" in envelope["result"]
    assert SECRET_TOKEN not in page.content()
    audit = page.goto(console.url + "/console/audit?tool=weather_forecast&principal=ops&exit_code=0")
    assert audit is not None and envelope["callId"] in page.locator("table").inner_text()


def test_a_parked_call_is_approved_from_the_page_and_runs_once(console: ConsoleStack, page: Page) -> None:
    """A REST call to a tool that needs approval waits on the Approvals page; an operator without `approve` sees
    it but cannot decide; one with it approves it with a reason, and the upstream gets the call once."""
    headers = {"Authorization": f"Bearer {LEGACY_TOKEN}"}
    with httpx2.Client(base_url=console.url, timeout=30, headers=headers) as client:
        parked = client.post("/v1/calls", json={"tool": "risky_delete", "arguments": {"item": "console-approved"}})
        assert parked.status_code == 202, parked.text
        call_id = parked.json()["callId"]
        sign_in(page, console)
        page.get_by_role("link", name="Approvals").click()
        assert page.locator("h1").inner_text() == "Approvals"
        assert call_id in page.locator("table").inner_text()
        assert page.get_by_role("button", name="Approve").first.is_disabled()
        page.get_by_role("button", name="Sign out").click()
        sign_in(page, console, APPROVER_TOKEN)
        page.get_by_role("link", name="Approvals").click()
        row = page.locator("tbody tr", has_text=call_id)
        row.get_by_label("Reason").fill("checked by the on-call")
        row.get_by_role("button", name="Approve").click()
        assert f"Approved {call_id}" in page.locator("main").inner_text()
        assert call_id not in page.locator("table").inner_text()
        wait_until(lambda: client.get(f"/v1/calls/{call_id}").status_code == 200, 30, "the approved call's envelope")
        assert client.get(f"/v1/calls/{call_id}").json()["exitCode"] == 0
    assert console.upstream.hits_to("/echo/risky/console-approved") == 1
    audit = console.cli("audit", "--principal", "approver")
    assert call_id in audit.stdout and "checked by the on-call" in audit.stdout


def test_the_audit_page_filters_like_the_stream(console: ConsoleStack, page: Page) -> None:
    """One row per record of the stream that matches the principal, tool and exit code asked."""
    for token in (ALPHA_TOKEN, ALPHA_TOKEN, BETA_TOKEN):
        body = {"tool": "echo_get", "arguments": {"item": "audited"}}
        assert (
            httpx2.post(
                console.url + "/v1/calls", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ).json()["exitCode"]
            == 0
        )
    sign_in(page, console)
    page.get_by_role("link", name="Audit").click()
    page.get_by_label("Principal").fill("alpha")
    page.get_by_label("Tool").fill("echo_get")
    page.get_by_label("Exit code").fill("0")
    page.get_by_role("button", name="Filter").click()
    rows = table_rows(page)
    printed = [json.loads(line) for line in console.cli("audit", "--principal", "alpha").stdout.splitlines()]
    wanted = [r for r in printed if r.get("tool") == "echo_get" and r.get("exitCode") == "0"]
    assert len(rows) == len(wanted) >= 2
    assert [row[4] for row in rows] == [r["callId"] for r in reversed(wanted)]


# --- dead letters -----------------------------------------------------------------------------------


def test_dead_letters_inspect_replay_and_purge(console: ConsoleStack, page: Page) -> None:
    """A row per item with its reason; the detail hides the header's value; Replay answers the call once;
    Purge removes exactly that item; the secret is nowhere (pages, CLI, Redis)."""
    (replayed, replayed_call), (purged, _), (kept, _) = make_dead_letters(console, 3)
    sign_in(page, console)
    page.get_by_role("link", name="Dead letters").click()
    rows = {row[0]: row[1] for row in table_rows(page)}
    assert rows[replayed] == rows[purged] == "unknown task 'not.a.task'"
    page.get_by_role("link", name=replayed).click()
    detail = page.locator("#item").inner_text()
    assert "X-Secret" in detail and HEADER_SECRET not in page.content()
    listed = console.cli("dead-letters", "list").stdout
    assert f"{replayed}  " in listed and "unknown task 'not.a.task'" in listed
    shown = console.cli("dead-letters", "show", replayed)
    assert json.loads(shown.stdout)["id"] == replayed and HEADER_SECRET not in shown.stdout
    page.get_by_role("button", name="Replay").click()
    assert f"Replayed {replayed}" in page.locator("[role=status]").inner_text()
    with console.redis() as r:
        wait_until(lambda: r.exists(RESULT_KEY_PREFIX + replayed_call), 30, "the replayed call's envelope")
        assert replayed not in dead_letter_ids(r)
    again = console.cli("dead-letters", "replay", replayed)
    assert again.returncode == 1 and "no dead letter" in again.stderr
    page.goto(console.url + f"/console/dead-letters/{purged}")
    page.get_by_role("button", name="Purge").click()
    assert f"Purged {purged}" in page.locator("[role=status]").inner_text()
    with console.redis() as r:
        ids = dead_letter_ids(r)
        assert purged not in ids and kept in ids
        assert HEADER_SECRET not in every_value(r)


def test_the_cli_replays_and_purges_by_stable_id(console: ConsoleStack) -> None:
    """`dead-letters replay N` answers the call once; `purge N --yes` removes only that item; both audited."""
    (replayed, call_id), (purged, _), (kept, _) = make_dead_letters(console, 3)
    assert console.cli("dead-letters", "replay", replayed).returncode == 0
    assert console.cli("dead-letters", "purge", purged, "--yes").returncode == 0
    with console.redis() as r:
        wait_until(lambda: r.exists(RESULT_KEY_PREFIX + call_id), 30, "the replayed call's envelope")
        ids = dead_letter_ids(r)
    assert replayed not in ids and purged not in ids and kept in ids
    audit = console.cli("audit").stdout
    assert f'"target": "{purged}"' in audit and f'"target": "{replayed}"' in audit


def test_old_records_without_an_id_are_named_by_their_digest(console: ConsoleStack) -> None:
    """A dead letter written before ids existed is listed under a digest id that purges exactly it."""
    old = json.dumps({"reason": "old record", "error": None, "body": None, "bytes": 3, "sha256": "x", "at": 1.0})
    with console.redis() as r:
        r.lpush(DEAD_LETTER_KEY, old)
    line = next(line for line in console.cli("dead-letters", "list").stdout.splitlines() if "old record" in line)
    item = line.split()[0]
    assert item.startswith("sha-")
    assert console.cli("dead-letters", "purge", item).returncode == 0
    assert "old record" not in console.cli("dead-letters", "list").stdout


# --- CSRF and Origin --------------------------------------------------------------------------------


def test_a_post_without_the_csrf_token_or_from_another_origin_changes_nothing(console: ConsoleStack) -> None:
    """Purge without the CSRF token, or with a foreign Origin, is 403 and the item stays; with both, it goes."""
    [(item, _)] = make_dead_letters(console, 1)
    target = f"/console/dead-letters/{item}/purge"
    with http_session(console) as (client, csrf):
        refusals = [
            client.post(target, data={}, headers={"Origin": console.url}),
            client.post(target, data={"csrf_token": "forged"}, headers={"Origin": console.url}),
            client.post(target, data={"csrf_token": csrf}, headers={"Origin": "http://evil.example"}),
            client.post("/console/logout", data={"csrf_token": csrf}, headers={"Origin": "http://127.0.0.1:1"}),
        ]
        assert [answer.status_code for answer in refusals] == [403, 403, 403, 403]
        with console.redis() as r:
            assert item in dead_letter_ids(r)
        assert client.get("/console/fleet").status_code == 200  # still signed in
        done = client.post(target, data={"csrf_token": csrf}, headers={"Origin": console.url})
        assert done.status_code == 303
    with console.redis() as r:
        assert item not in dead_letter_ids(r)


def test_the_login_form_needs_its_csrf_token(console: ConsoleStack) -> None:
    """A sign-in POST without the login form's token is refused, and sets no cookie."""
    answer = httpx2.post(console.url + "/console/login", data={"token": OPS_TOKEN}, timeout=30)
    assert answer.status_code == 403 and "set-cookie" not in answer.headers


def test_sessions_and_tokens_are_not_in_redis_in_clear(console: ConsoleStack) -> None:
    """Redis holds a digest of the session id, never the id, the token or the CSRF token in a key name."""
    with http_session(console) as (client, _):
        session_id = client.cookies["toolworker_console"]
    with console.redis() as r:
        everything = every_value(r)
    assert session_id not in everything and OPS_TOKEN not in everything


def test_the_openapi_document_has_no_console_route(console: ConsoleStack) -> None:
    """The console stays out of the REST API's description."""
    document = httpx2.get(console.url + "/v1/openapi.json", headers={"Authorization": f"Bearer {OPS_TOKEN}"})
    assert document.status_code == 200 and not [p for p in document.json()["paths"] if "console" in p]


def test_screenshots_live_outside_git() -> None:
    """The folder the screenshots go to is ignored by git: they are never committed."""
    ignored = subprocess.run(["git", "check-ignore", "-q", str(screenshot_dir())], cwd=Path(__file__).parent)
    assert ignored.returncode == 0


def test_the_console_opens_no_other_route_without_a_token(console: ConsoleStack) -> None:
    """Only /console itself skips the bearer check: paths that merely start alike, or climb out, do not."""
    with httpx2.Client(base_url=console.url, timeout=30) as client:
        assert client.get("/consolex").status_code == 401
        assert client.get("/v1/tools").status_code == 401
    with socket.create_connection(("127.0.0.1", console.gateway.port), timeout=30) as raw:
        raw.sendall(b"GET /console/../v1/tools HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b"".join(iter(lambda: raw.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 404") and b'"tools"' not in answer
