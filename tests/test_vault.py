"""End users' tokens, end to end: a real authorization server (oidc-provider), a protected upstream that
validates its JWTs, two workers, a gateway, and a scripted browser that consents."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
import redis

from tests.support.log_lines import log_events
from tests.support.vault_stack import (
    ACCESS_TOKEN_TTL_S,
    AGENT,
    ALICE_TOKEN,
    BOB_TOKEN,
    CAROL_TOKEN,
    DAVE_TOKEN,
    EVE_TOKEN,
    FRANK_TOKEN,
    GRACE_TOKEN,
    KATE_TOKEN,
    PEOPLE_SECRET,
    VAULT_KEY,
    VaultStack,
    bearer,
    consent,
    link_in,
    vault_stack,
)
from worker import ToolClient
from worker.call.vault import Keyring, TokenSet, record_key
from worker.constants import AUDIT_STREAM_KEY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
__all__ = ["vault_stack"]


def rest_call(stack: VaultStack, token: str, tool: str = "whoami") -> dict:
    answer = httpx2.post(
        stack.url + "/v1/calls", json={"tool": tool, "arguments": {}}, headers=bearer(token), timeout=60
    )
    assert answer.status_code == 200, answer.text
    envelope: dict = answer.json()
    return envelope


def connect(stack: VaultStack, token: str, login: str, tool: str = "whoami") -> None:
    """Call once (67 with a link), consent in the browser as `login`."""
    first = rest_call(stack, token, tool)
    assert first["exitCode"] == 67, first
    page = consent(link_in(first["error"]["message"]), login)
    assert page.status_code == 200 and "Connected people" in page.text, page.text


def test_consent_then_the_call_carries_the_users_token(vault_stack: VaultStack) -> None:
    """A call for a user without a connection is 67 with a connect link; once the user consents, the same
    call reaches the upstream with the user's own token (its `sub`)."""
    first = rest_call(vault_stack, ALICE_TOKEN)
    assert first["exitCode"] == 67 and first["error"]["type"] == "authorization_required", first
    assert first["statusCode"] is None
    link = link_in(first["error"]["message"])
    assert link.startswith(vault_stack.url + "/v1/connections/people/authorize?")
    page = consent(link, "alice-account")
    assert page.status_code == 200 and "Connected people" in page.text, page.text
    second = rest_call(vault_stack, ALICE_TOKEN)
    assert second["exitCode"] == 0, second
    assert json.loads(second["result"]) == {"sub": "alice-account"}
    assert second["headers"]["Authorization"] == "[redacted]"


def test_a_user_never_gets_another_users_token(vault_stack: VaultStack) -> None:
    """Once alice has connected, bob's call is still 67; after bob connects, each call carries its own
    user's token."""
    alice = rest_call(vault_stack, ALICE_TOKEN)
    if alice["exitCode"] == 67:
        consent(link_in(alice["error"]["message"]), "alice-account")
    bob = rest_call(vault_stack, BOB_TOKEN)
    assert bob["exitCode"] == 67, bob
    consent(link_in(bob["error"]["message"]), "bob-account")
    assert json.loads(rest_call(vault_stack, BOB_TOKEN)["result"]) == {"sub": "bob-account"}
    assert json.loads(rest_call(vault_stack, ALICE_TOKEN)["result"]) == {"sub": "alice-account"}


def test_a_queue_producer_names_the_user_with_user(vault_stack: VaultStack) -> None:
    """`ToolClient.call(..., user=...)` (the raw call object's `"user"`) acts for that user: alice's own
    token for alice, and 67 with a link for a user who never connected."""
    connect_if_needed(vault_stack, ALICE_TOKEN, "alice-account")
    with ToolClient(vault_stack.redis.url) as client:
        alice = client.call("whoami", user="alice", timeout=60)
        stranger = client.call("whoami", user="nobody-here", timeout=60)
    assert alice.exit_code == 0 and json.loads(alice.result) == {"sub": "alice-account"}, alice.to_dict()
    assert stranger.exit_code == 67 and "'nobody-here'" in (stranger.error or {})["message"]


def test_a_401_refreshes_the_token_once_and_the_call_goes_through(vault_stack: VaultStack) -> None:
    """An access token the upstream refuses (401) is refreshed once, and the call is sent again with the
    new one."""
    connect(vault_stack, KATE_TOKEN, "kate-account")
    before = _vault_record(vault_stack, "kate")
    assert before is not None
    vault_stack.guarded.refused.add(before.access_token)
    answer = rest_call(vault_stack, KATE_TOKEN)
    assert answer["exitCode"] == 0 and json.loads(answer["result"]) == {"sub": "kate-account"}, answer
    assert answer["attempts"] == 2
    after = _vault_record(vault_stack, "kate")
    assert after is not None and after.access_token != before.access_token
    assert after.refresh_token != before.refresh_token  # rotated by the server


def test_a_connect_link_or_state_used_twice_tampered_or_anothers_is_refused(vault_stack: VaultStack) -> None:
    """A spent link, a tampered state and a state brought back by another browser are refused (403) and
    store nothing."""
    link = link_in(rest_call(vault_stack, CAROL_TOKEN)["error"]["message"])
    with httpx2.Client(timeout=20) as browser:
        opened = browser.get(link)
        assert opened.status_code == 302
        assert browser.get(link).status_code == 403  # spent
        state = parse_qs(urlsplit(opened.headers["location"]).query)["state"][0]
        callback = vault_stack.url + "/v1/connections/callback"
        tampered = state[:-1] + ("A" if state[-1] != "A" else "B")
        assert browser.get(callback, params={"state": tampered, "code": "x"}).status_code == 403
    with httpx2.Client(timeout=20) as stranger:  # no binding cookie: another browser
        assert stranger.get(callback, params={"state": state, "code": "x"}).status_code == 403
    answer = httpx2.get(vault_stack.url + "/v1/connections", headers=bearer(CAROL_TOKEN), timeout=10)
    assert answer.json() == {"connections": []}


def test_connections_are_listed_and_revoked_through_the_api(vault_stack: VaultStack) -> None:
    """GET /v1/connections shows the caller's own (no token); DELETE revokes it at the server and removes it,
    so the next call is 67 again; the audit trail has the connect and the revoke."""
    connect(vault_stack, DAVE_TOKEN, "dave-account")
    listed = httpx2.get(vault_stack.url + "/v1/connections", headers=bearer(DAVE_TOKEN), timeout=10).json()
    assert [c["upstream"] for c in listed["connections"]] == ["people"]
    assert set(listed["connections"][0]) == {"upstream", "scopes", "expiresAt"}
    assert "people.read" in listed["connections"][0]["scopes"]
    removed = httpx2.delete(vault_stack.url + "/v1/connections/people", headers=bearer(DAVE_TOKEN), timeout=20)
    assert removed.status_code == 200 and removed.json()["revokedAtServer"] is True, removed.text
    assert rest_call(vault_stack, DAVE_TOKEN)["exitCode"] == 67
    again = httpx2.delete(vault_stack.url + "/v1/connections/people", headers=bearer(DAVE_TOKEN), timeout=20)
    assert again.status_code == 404
    events = _audit(vault_stack, "dave")
    assert ("connect", "people") in events and ("revoke", "people") in events


def test_connections_are_listed_and_revoked_with_the_cli(vault_stack: VaultStack) -> None:
    """`toolworker connections list --user U` and `revoke --user U --upstream X` do the same from a shell."""
    connect(vault_stack, EVE_TOKEN, "eve-account")
    listed = _cli(vault_stack, "list", "--user", "eve")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout.splitlines()[-1])["upstream"] == "people"
    revoked = _cli(vault_stack, "revoke", "--user", "eve", "--upstream", "people")
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout.splitlines()[-1])["revokedAtServer"] is True
    assert "people" not in _cli(vault_stack, "list", "--user", "eve").stdout
    assert rest_call(vault_stack, EVE_TOKEN)["exitCode"] == 67


def test_a_refresh_the_server_refuses_removes_the_connection(vault_stack: VaultStack) -> None:
    """When the grant is revoked behind the fleet's back, the 401's refresh is refused: the call is 67, the
    connection is gone and the audit trail says so."""
    connect(vault_stack, FRANK_TOKEN, "frank-account")
    tokens = _vault_record(vault_stack, "frank")
    revoke = {"token": tokens.refresh_token, "token_type_hint": "refresh_token", "client_id": "people-app"}
    revoke["client_secret"] = PEOPLE_SECRET
    assert httpx2.post(vault_stack.oidc.issuer + "/token/revocation", data=revoke, timeout=10).status_code == 200
    vault_stack.guarded.refused.add(tokens.access_token)
    answer = rest_call(vault_stack, FRANK_TOKEN)
    assert answer["exitCode"] == 67 and "/v1/connections/people/authorize" in answer["error"]["message"], answer
    assert ("refresh_failed", "people") in _audit(vault_stack, "frank")
    assert _vault_record(vault_stack, "frank", required=False) is None


def test_short_lived_tokens_are_refreshed_once_per_lifetime_for_the_fleet(vault_stack: VaultStack) -> None:
    """Two workers calling for one user over several token lifetimes refresh about once per lifetime
    between them (a rotated refresh token used twice would revoke the grant: every call would fail), and
    never send a token the upstream refuses as expired, though calls wait for the upstream's rate limit after
    they took it (an upstream that counts failed authentications would lock the user out)."""
    connect(vault_stack, GRACE_TOKEN, "grace-account", "whoami_limited")
    first, refused_before = len(vault_stack.guarded.seen), len(vault_stack.guarded.refusals)
    started = time.monotonic()
    results = []
    with ThreadPoolExecutor(8) as pool:
        while time.monotonic() - started < 4 * ACCESS_TOKEN_TTL_S:
            results += list(pool.map(lambda _: rest_call(vault_stack, GRACE_TOKEN, "whoami_limited"), range(8)))
    elapsed = time.monotonic() - started
    refusals = len(vault_stack.guarded.refusals) - refused_before
    print(f"the upstream refused {refusals} tokens (401) in {elapsed:.1f} s")
    assert refusals <= elapsed / ACCESS_TOKEN_TTL_S, refusals  # at most one refused call per lifetime
    assert all(r["exitCode"] == 0 and json.loads(r["result"]) == {"sub": "grace-account"} for r in results), results[-1]
    tokens = set(vault_stack.guarded.seen[first:])
    lifetimes = elapsed / (0.8 * ACCESS_TOKEN_TTL_S)  # refreshed at 80% of a lifetime
    assert 2 <= len(tokens) <= lifetimes + 2, (len(tokens), elapsed)
    served = [
        sum(1 for event in log_events(log.read_text()) if event.get("principal") == "grace")
        for log in vault_stack.worker_logs
    ]
    assert all(served), served  # both workers took grace's calls
    print(f"{len(results)} calls over {elapsed:.1f} s with {ACCESS_TOKEN_TTL_S} s tokens: {len(tokens)} tokens")


def test_token_exchange_for_an_oauth_caller(vault_stack: VaultStack) -> None:
    """A caller with an OAuth access token gets its token exchanged (RFC 8693) for one meant for the
    upstream: the upstream sees the caller's `sub`; the subject token is never sent upstream."""
    access_token = vault_stack.oidc.token(AGENT)
    answer = rest_call(vault_stack, access_token, "whoami_exchanged")
    assert answer["exitCode"] == 0, answer
    assert json.loads(answer["result"]) == {"sub": AGENT.client_id}
    assert access_token not in vault_stack.guarded.seen
    assert access_token not in _redis_text(vault_stack)  # neither stored nor queued
    static = rest_call(vault_stack, ALICE_TOKEN, "whoami_exchanged")  # a static token has nothing to exchange
    assert static["exitCode"] == 67, static


def test_no_token_in_clear_in_redis_logs_envelopes_or_audit(vault_stack: VaultStack) -> None:
    """Every access and refresh token is absent, in clear, from every Redis key and value, the workers' and
    gateway's logs and the audit stream."""
    connect_if_needed(vault_stack, ALICE_TOKEN, "alice-account")
    rest_call(vault_stack, ALICE_TOKEN)
    records = [_vault_record(vault_stack, user, required=False) for user in ("alice", "bob", "grace")]
    secrets = set(vault_stack.guarded.seen) | {r.refresh_token for r in records if r and r.refresh_token}
    assert secrets
    text = _redis_text(vault_stack) + vault_stack.logs()
    leaked = [s[:12] for s in secrets if s in text or s.split(".")[-1] in text]
    assert not leaked, leaked


def _redis_text(stack: VaultStack) -> str:
    """Every key and value in Redis, as text."""
    client = redis.Redis.from_url(stack.redis.url)
    blobs = []
    for key in client.scan_iter(count=1000):
        blobs.append(key)
        kind = client.type(key)
        if kind == b"string":
            blobs.append(client.get(key) or b"")
        elif kind == b"list":
            blobs += client.lrange(key, 0, -1)
        elif kind == b"hash":
            blobs += [k + v for k, v in client.hgetall(key).items()]
        elif kind == b"set":
            blobs += list(client.smembers(key))
        elif kind == b"zset":
            blobs += client.zrange(key, 0, -1)
        elif kind == b"stream":
            blobs += [
                json.dumps({k.decode(): v.decode() for k, v in f.items()}).encode() for _, f in client.xrange(key)
            ]
    return b"\n".join(blobs).decode("utf-8", "replace")


def connect_if_needed(stack: VaultStack, token: str, login: str) -> None:
    answer = rest_call(stack, token)
    if answer["exitCode"] == 67:
        consent(link_in(answer["error"]["message"]), login)


def _audit(stack: VaultStack, user: str) -> list[tuple[str, str]]:
    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    entries = client.xrange(AUDIT_STREAM_KEY)
    return [(f["event"], f["upstream"]) for _, f in entries if f.get("principal") == user and "event" in f]


def _vault_record(stack: VaultStack, user: str, required: bool = True) -> TokenSet | None:
    """The user's token set, opened with the test's vault key (as only the fleet can)."""
    client = redis.Redis.from_url(stack.redis.url)
    key = record_key(user, "people")
    sealed = client.get(key)
    if sealed is None:
        assert not required, f"{user} has no connection"
        return None
    plaintext = Keyring.parse(VAULT_KEY).open(sealed, key)
    assert plaintext is not None
    return TokenSet.decode(plaintext)


def _cli(stack: VaultStack, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "worker", "connections", *args]
    return subprocess.run(argv, env=stack.env, capture_output=True, text=True, timeout=60)
