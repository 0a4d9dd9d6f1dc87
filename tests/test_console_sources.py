"""The console's Approvals and Connections pages, in a real headless browser, against sources of the shape
the console asks for (sources.py): the console in this process on uvicorn, its sessions in a real Redis."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from playwright.sync_api import Page
from starlette.applications import Starlette

from tests.support.browser import AsgiThread, browser, page
from worker.connections import async_client, sync_client
from worker.dev.embedded import EmbeddedRedis
from worker.gateway.console import Console, Extensions
from worker.gateway.console.gate import Gate
from worker.gateway.console.sessions import Sessions
from worker.gateway.console.sources import Connection, NotWaiting, WaitingCall
from worker.gateway.identity.audit import Action
from worker.gateway.identity.principals import Grant, Principal, StaticTokens
from worker.shards import Shards

pytestmark = pytest.mark.integration
__all__ = ["browser", "page"]

APPROVER_TOKEN = "approver-token-1f2e3d"
WATCHER_TOKEN = "watcher-token-9c8b7a"
VAULT_TOKEN = "gho_vault-secret-token-5566"


@dataclass
class FakeApprovals:
    parked: dict[str, WaitingCall] = field(default_factory=dict)
    decided: list[tuple[str, str, str, str]] = field(default_factory=list)

    async def waiting(self) -> list[WaitingCall]:
        return list(self.parked.values())

    async def decide(self, call_id: str, decision: str, reason: str, principal: Principal) -> None:
        if self.parked.pop(call_id, None) is None:
            raise NotWaiting(f"{call_id} is not waiting")
        self.decided.append((call_id, decision, reason, principal.name))


class FakeConnections:
    """A vault: tokens beside what the console may see of them."""

    def __init__(self) -> None:
        self.vault = {
            ("alice", "github"): VAULT_TOKEN,
            ("alice", "drive"): VAULT_TOKEN + "-2",
            ("bob", "github"): VAULT_TOKEN + "-3",
        }

    async def connections(self, user: str | None) -> list[Connection]:
        return [
            Connection(who, upstream, ("repo",), "connected", "2026-12-01T00:00:00Z")
            for who, upstream in self.vault
            if user is None or who == user
        ]


@dataclass
class Recorded:
    entries: list[Any] = field(default_factory=list)

    def record(self, entry: Any) -> None:
        self.entries.append(entry)


@dataclass
class CallsStub:
    """The console's calls, for pages that make none: only the audit trail is used."""

    audit: Recorded = field(default_factory=Recorded)


@dataclass
class Sources:
    url: str
    approvals: FakeApprovals
    audit: Recorded


@pytest.fixture
def sources(redis_server: EmbeddedRedis) -> Iterator[Sources]:
    approvals = FakeApprovals(
        {
            "call-a": WaitingCall("call-a", "refund", "ci-bot", "ci", "2026-11-26T05:00:00Z", "refund over 100"),
            "call-b": WaitingCall("call-b", "delete_repo", "ci-bot", "ci", "2026-11-26T05:01:00Z", "destructive"),
        }
    )
    tokens = StaticTokens(
        [
            (APPROVER_TOKEN, Principal("approver", grant=Grant(actions=frozenset({"operate", "approve"})))),
            (WATCHER_TOKEN, Principal("watcher", grant=Grant(actions=frozenset({"operate"})))),
        ]
    )
    clients = (sync_client(redis_server.url), async_client(redis_server.url))
    gate = Gate(Sessions(clients[1], 600), tokens, False, "")
    calls = CallsStub()
    extensions = Extensions(approvals, FakeConnections())
    shards = [(Shards.single(redis_server.url).home, clients[0])]
    console = Console(calls, gate, shards, clients[1], 10.0, extensions)  # type: ignore[arg-type]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await clients[1].aclose()  # on the server's loop, where its connections live

    server = AsgiThread(Starlette(routes=console.routes(), lifespan=lifespan)).start()
    try:
        yield Sources(server.url, approvals, calls.audit)
    finally:
        server.stop()
        clients[0].close()


def sign_in(page: Page, url: str, token: str) -> None:
    page.goto(url + "/console/login")
    page.get_by_label("Token").fill(token)
    page.get_by_label("Token").press("Enter")
    assert page.locator("h1").inner_text() == "Fleet" or page.url.endswith("/console/fleet")


def test_the_nav_names_approvals_and_connections_when_they_exist(sources: Sources, page: Page) -> None:
    """With both sources, the nav links to Approvals and Connections, each page with its <h1>."""
    sign_in(page, sources.url, APPROVER_TOKEN)
    page.goto(sources.url + "/console/audit")
    labels = page.locator("nav a").all_inner_texts()
    assert labels == ["Fleet", "Catalog", "Upstreams", "Dead letters", "Audit", "Approvals", "Connections"]
    for label in ("Approvals", "Connections"):
        page.get_by_role("link", name=label).click()
        assert page.locator("h1").inner_text() == label


def test_a_call_is_approved_and_another_denied_from_the_page(sources: Sources, page: Page) -> None:
    """A row per waiting call with its callId; Approve with a reason decides it; Deny needs a reason; both
    are in the audit trail with the principal and reason."""
    sign_in(page, sources.url, APPROVER_TOKEN)
    page.goto(sources.url + "/console/approvals")
    assert [row.split("\t")[0] for row in page.locator("tbody tr").all_inner_texts()] == ["call-a", "call-b"]
    row = page.locator("tr", has_text="call-a")
    row.get_by_label("Reason").fill("checked with finance")
    row.get_by_role("button", name="Approve").click()
    assert "Approved call-a" in page.locator("[role=status]").inner_text()
    assert sources.approvals.decided == [("call-a", "approve", "checked with finance", "approver")]
    page.locator("tr", has_text="call-b").get_by_role("button", name="Deny").click()
    assert page.locator("h1").inner_text() == "A reason, please"
    assert "call-b" in sources.approvals.parked
    page.goto(sources.url + "/console/approvals")
    row = page.locator("tr", has_text="call-b")
    row.get_by_label("Reason").fill("not on a Friday")
    row.get_by_role("button", name="Deny").click()
    assert sources.approvals.decided[-1] == ("call-b", "deny", "not on a Friday", "approver")
    assert page.locator("tbody tr").count() == 0
    actions = [(e.action, e.target, e.detail) for e in sources.audit.entries if isinstance(e, Action)]
    assert ("approval.approve", "call-a", "checked with finance") in actions
    assert ("approval.deny", "call-b", "not on a Friday") in actions


def test_a_principal_without_approve_sees_but_cannot_decide(sources: Sources, page: Page) -> None:
    """Without the approve grant the buttons are disabled, and a POST anyway is 403 and decides nothing."""
    sign_in(page, sources.url, WATCHER_TOKEN)
    page.goto(sources.url + "/console/approvals")
    assert page.get_by_role("button", name="Approve").first.is_disabled()
    csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    answer = httpx2.post(
        sources.url + "/console/approvals/call-a",
        data={"csrf_token": csrf, "decision": "approve", "reason": "x"},
        cookies=cookies,
        headers={"Origin": sources.url},
    )
    assert answer.status_code == 403 and sources.approvals.decided == []


def test_connections_are_listed_per_user_without_a_token(sources: Sources, page: Page) -> None:
    """The User filter lists that user's connections; no token reaches the page."""
    sign_in(page, sources.url, WATCHER_TOKEN)
    page.goto(sources.url + "/console/connections")
    assert page.locator("tbody tr").count() == 3
    page.get_by_label("User").fill("alice")
    page.get_by_role("button", name="Show").click()
    rows = [re.split(r"\t", row) for row in page.locator("tbody tr").all_inner_texts()]
    assert sorted((row[0], row[1]) for row in rows) == [("alice", "drive"), ("alice", "github")]
    assert VAULT_TOKEN not in page.content()
