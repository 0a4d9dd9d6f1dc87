"""Who lists an MCP upstream that wants a user's token even for that (fakeredis): the first user who connects
it, forgotten with their connection; the refresh that reads the tools as them; the listing the connect callback
starts. The whole flow, with real servers, is in tests/test_mcp_first_user.py."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import fakeredis
import pytest
from structlog.testing import capture_logs

from worker.call.vault import LISTER_KEY_PREFIX, Keyring, TokenSet, Vault, lister, remember_lister
from worker.definitions import file_store, listings
from worker.definitions.mcp_tools import Listing
from worker.definitions.model import Upstream
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport
from worker.mcp_client.sessions import Sessions
from worker.upstreams.first_user import FirstListing
from worker.upstreams.refresh import Refresher

KEYRING = Keyring.parse("k1:" + base64.b64encode(b"1" * 32).decode())
TOKENS = TokenSet("access-secret-value", "refresh-secret-value", time.time() + 300, ("read",), time.time())
DEFINITIONS = """
upstreams:
  files:
    mcp: {url: 'https://files.example/mcp'}
    auth: {type: oauth2_user, issuer: 'https://as.example', client_id: app}
  fleet:
    mcp: {url: 'https://fleet.example/mcp'}
    auth: {type: oauth2_client_credentials, token_url: 'https://as.example/token', client_id: a, client_secret: s}
"""


@pytest.fixture
def upstreams(tmp_path: Path) -> dict[str, Upstream]:
    (tmp_path / "d.yaml").write_text(DEFINITIONS)
    toolset = file_store.load([tmp_path])
    assert not toolset.problems, toolset.problems
    return toolset.upstreams


async def test_the_first_user_to_connect_lists_and_is_forgotten_with_their_connection() -> None:
    """The first to connect wins; removing another user's connection keeps them; removing theirs forgets them
    (and the next user who connects lists it); the key holds a name, never a token."""
    redis = fakeredis.aioredis.FakeRedis()
    vault = Vault(redis, KEYRING)
    for user in ("ann", "bob"):
        await vault.put(user, "files", TOKENS)
    assert await remember_lister(redis, "files", "ann") is True
    assert await remember_lister(redis, "files", "bob") is False
    assert await lister(redis, "files") == "ann"
    assert await redis.get(LISTER_KEY_PREFIX + "files") == b"ann"
    assert await vault.delete("bob", "files")
    assert await lister(redis, "files") == "ann"
    assert await vault.delete("ann", "other") is False  # another upstream's connection: nothing to forget
    assert await lister(redis, "files") == "ann"
    assert await vault.delete("ann", "files")
    assert await lister(redis, "files") is None
    assert await remember_lister(redis, "files", "bob") is True
    assert await lister(redis, "files") == "bob"


async def test_a_refresh_without_a_lister_fails_and_says_why(upstreams: dict[str, Upstream]) -> None:
    """No user has connected an `oauth2_user` upstream: the refresh stores its failure, saying how it gets
    listed, without asking the server anything."""
    redis = fakeredis.aioredis.FakeRedis()
    transport = HttpTransport(EgressPolicy.parse(""))
    refresher = Refresher(redis, Sessions(), {}, transport, 100)
    try:
        listing = await refresher.refresh(upstreams["files"])
    finally:
        await transport.close()
    assert listing.error is not None and "no user has connected it yet" in listing.error
    assert listing.listed_at is None and listing.tried_at is not None
    stored = await listings.read_one(redis, "files")
    assert stored is not None and stored.error == listing.error


async def test_a_connection_starts_a_listing_only_where_one_is_wanted(upstreams: dict[str, Upstream]) -> None:
    """A user's connection to an `oauth2_user` MCP upstream not listed, or whose last refresh failed, starts a
    refresh; one listed fine, or an upstream whose listing acts for no user, starts none."""
    redis = fakeredis.aioredis.FakeRedis()
    started: list[tuple[str, float]] = []

    async def refresh(upstream: Upstream, noticed: float) -> None:
        started.append((upstream.name, noticed))

    first = FirstListing(redis, refresh)
    assert first.connected("ann", upstreams["fleet"]) is None
    before = time.time()
    task = first.connected("ann", upstreams["files"])
    assert task is not None
    await task
    assert [name for name, _ in started] == ["files"] and started[0][1] >= before
    assert await lister(redis, "files") == "ann"
    await listings.write(redis, Listing("files", {}, {}, "2025-06-18", time.time(), time.time(), None), [], 10)
    task = first.connected("bob", upstreams["files"])
    assert task is not None
    await task
    assert len(started) == 1 and await lister(redis, "files") == "ann"
    failed = Listing("files", {}, {}, "2025-06-18", time.time(), time.time(), "the server said 401")
    await listings.write(redis, failed, [], 10)
    task = first.connected("cat", upstreams["files"])
    assert task is not None
    await task
    assert len(started) == 2 and not first.running


async def test_a_failing_listing_is_logged_and_not_raised(upstreams: dict[str, Upstream]) -> None:
    """Nobody awaits the background listing: its failure is a log line."""

    async def refresh(upstream: Upstream, noticed: float) -> None:
        raise RuntimeError("the server is down")

    first = FirstListing(fakeredis.aioredis.FakeRedis(), refresh)
    with capture_logs() as logs:
        task = first.connected("ann", upstreams["files"])
        assert task is not None
        await task
    failed = [entry for entry in logs if entry["event"] == "mcp.first_listing_failed"]
    assert failed and failed[0]["error"] == "the server is down"
