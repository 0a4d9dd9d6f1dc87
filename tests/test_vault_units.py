"""The vault's pieces at their seams (fakeredis): sealing, key rotation, connect links, definitions, and
the gateway's first 401 naming its scopes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fakeredis
import pytest
from structlog.testing import capture_logs

from tests.support.waiting import scaled
from worker.call import connect as connect_module
from worker.call.connect import ConnectLinks
from worker.call.renewal import MAX_SEND_MARGIN_S, SEND_MARGIN_S
from worker.call.vault import Keyring, TokenSet, Vault, VaultKeyError, record_key
from worker.definitions import file_store
from worker.gateway.identity.oauth import JwtVerifier
from worker.gateway.identity.principals import GrantSpec, OAuthSpec, StaticTokens
from worker.gateway.identity.security import Gatekeeper, Refusal, is_open_path
from worker.http.delegated import Issued, expiry


def key(kid: str, byte: bytes) -> str:
    return f"{kid}:" + base64.b64encode(byte * 32).decode()


TOKENS = TokenSet("access-secret-value", "refresh-secret-value", time.time() + 300, ("read",), time.time())


def test_vault_keys_must_be_kid_and_32_bytes() -> None:
    """A key that is not `kid:BASE64(32 bytes)` is refused, naming the kid and never the key."""
    with pytest.raises(VaultKeyError, match="'short'"):
        Keyring.parse("short:" + base64.b64encode(b"x" * 16).decode())
    with pytest.raises(VaultKeyError):
        Keyring.parse("nokid")
    assert Keyring.parse(f"{key('a', b'a')}, {key('b', b'b')}").sealing == "a"


async def test_a_record_is_sealed_and_opens_only_under_its_own_key() -> None:
    """Nothing of the token set is in Redis in clear, and a record copied under another user's key does
    not open (its Redis key is the associated data)."""
    redis = fakeredis.aioredis.FakeRedis()
    vault = Vault(redis, Keyring.parse(key("k1", b"1")))
    await vault.put("alice", "people", TOKENS)
    sealed = await redis.get(record_key("alice", "people"))
    assert b"secret-value" not in sealed and b"k1" in sealed
    assert await vault.get("alice", "people") == TOKENS
    await redis.set(record_key("mallory", "people"), sealed)
    with capture_logs() as logs:
        assert await vault.get("mallory", "people") is None
    assert [entry["event"] for entry in logs] == ["vault.record_unreadable"]


async def test_key_rotation_reseals_with_the_new_key_and_a_record_no_key_opens_is_no_connection() -> None:
    """With a new key in front, a record sealed with the old one still opens and is resealed with the new
    one, so the old key can go; a record no configured key opens is no connection (and logged)."""
    redis = fakeredis.aioredis.FakeRedis()
    await Vault(redis, Keyring.parse(key("k1", b"1"))).put("alice", "people", TOKENS)
    rotated = Vault(redis, Keyring.parse(f"{key('k2', b'2')},{key('k1', b'1')}"))
    assert await rotated.get("alice", "people") == TOKENS
    assert b'"kid": "k2"' in await redis.get(record_key("alice", "people"))
    assert await Vault(redis, Keyring.parse(key("k2", b"2"))).get("alice", "people") == TOKENS
    with capture_logs() as logs:
        assert await Vault(redis, Keyring.parse(key("k3", b"3"))).get("alice", "people") is None
        assert await Vault(redis, Keyring.parse(key("k3", b"3"))).connections("alice") == []
    assert logs and all(entry["event"] == "vault.record_unreadable" for entry in logs)


async def test_a_connect_link_is_single_use_for_its_upstream_and_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ticket is redeemed once, for the upstream it names, before it expires; a state likewise."""
    links = ConnectLinks(fakeredis.aioredis.FakeRedis(), Keyring.parse(key("k1", b"1")), "http://gw.example/", 600)
    link = await links.link("alice", "people")
    assert link.startswith("http://gw.example/v1/connections/people/authorize?ticket=")
    ticket = link.rsplit("=", 1)[1]
    assert await links.redeem(ticket, "other") is None  # spent too
    link = await links.link("alice", "people")
    ticket = link.rsplit("=", 1)[1]
    user, expires_at, scopes = await links.redeem(ticket, "people") or ("", 0.0, ())
    assert user == "alice" and expires_at > time.time() and scopes == ()
    assert await links.redeem(ticket, "people") is None
    state = await links.begin("alice", "people", "verifier", "binding", time.time() + 600)
    pending = await links.finish(state)
    assert pending is not None and pending.bound_to("binding") and not pending.bound_to("other")
    assert await links.finish(state) is None
    late = await links.link("alice", "people")
    monkeypatch.setattr(connect_module.time, "time", lambda: time.monotonic() + 10**10)
    assert await links.redeem(late.rsplit("=", 1)[1], "people") is None


@pytest.mark.parametrize(
    ("auth", "problem"),
    [
        ("{type: oauth2_user, client_id: app}", "issuer (or authorization_url and token_url)"),
        ("{type: oauth2_user, client_id: app, authorization_url: 'https://as/a'}", "issuer"),
        ("{type: oauth2_token_exchange, token_url: 'https://as/t', client_id: a, client_secret: s}", "audience"),
        ("{type: oauth2_user, issuer: 'https://as', client_id: a, per_call_header: X-T}", "vault"),
    ],
)
def test_validate_checks_delegated_auth(tmp_path: Path, auth: str, problem: str) -> None:
    """`toolworker validate` says what an `oauth2_user` or `oauth2_token_exchange` block lacks."""
    (tmp_path / "d.yaml").write_text(
        f"upstreams:\n  u:\n    base_url: https://api.example\n    auth: {auth}\n"
        "tools:\n  - {name: t, upstream: u, description: d, request: {method: GET, path: /}}\n"
    )
    toolset = file_store.load([tmp_path])
    assert any(problem in p for p in map(str, toolset.problems)), toolset.problems


def test_a_valid_oauth2_user_upstream_loads(tmp_path: Path) -> None:
    """Issuer discovery, scopes and extra parameters make a usable delegated upstream."""
    (tmp_path / "d.yaml").write_text(
        "upstreams:\n  u:\n    base_url: https://api.example\n    auth: {type: oauth2_user, issuer: 'https://as',"
        " client_id: app, client_secret: '${env:S}', scopes: [read, write], extra_params: {resource: 'https://api'}}\n"
        "tools:\n  - {name: t, upstream: u, description: d, request: {method: GET, path: /}}\n"
    )
    toolset = file_store.load([tmp_path], environ={"S": "x"})
    auth = toolset.upstreams["u"].auth
    assert not toolset.problems and auth is not None and auth.delegated and auth.scopes == ("read", "write")


async def test_the_first_401_names_the_scopes_to_ask_for() -> None:
    """RFC 6750 §3: a 401 without a token names the scopes (CHAL-03), not only an insufficient_scope 403."""
    spec = OAuthSpec(issuer="https://as.example", scopes={"tools.all": GrantSpec(tools=["*"])})
    keeper = Gatekeeper(StaticTokens([]), JwtVerifier(spec, "https://gw/mcp"), "https://gw/.well-known/x")
    refusal = await keeper.admit(b"")
    assert isinstance(refusal, Refusal) and refusal.status == 401
    challenge = dict(refusal.headers)[b"www-authenticate"].decode()
    assert 'scope="tools.all"' in challenge and "resource_metadata=" in challenge


def test_only_the_browser_routes_are_open() -> None:
    """A connect link and the callback need no bearer token; the connections API does."""
    assert is_open_path("/v1/connections/people/authorize") and is_open_path("/v1/connections/callback")
    assert not is_open_path("/v1/connections") and not is_open_path("/v1/connections/people")
    assert not is_open_path("/v1/connections/a/b/authorize")


@pytest.mark.integration
@pytest.mark.parametrize("command", ["worker", "gateway", "mcp"])
def test_unusable_vault_keys_stop_a_process_at_start(command: str) -> None:
    """A worker or gateway with a malformed TOOLWORKER_VAULT_KEYS says why and exits 78, never with a
    traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env["TOOLWORKER_VAULT_KEYS"] = "k1:c2hvcnQ="
    done = subprocess.run(
        [sys.executable, "-m", "worker", command], env=env, capture_output=True, text=True, timeout=scaled(60)
    )
    assert done.returncode == 78, done.stderr
    assert "TOOLWORKER_VAULT_KEYS: 'k1' is not `kid:BASE64(32 bytes)`" in done.stderr
    assert "Traceback" not in done.stderr


def _segment(part: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=")


def _jwt(claims: dict[str, object]) -> str:
    """An unsigned JWT (only its claims are read, to know its expiry)."""
    return f"{_segment({'alg': 'none'})}.{_segment(claims)}.sig"


def test_a_tokens_expiry_runs_from_the_request_and_ends_by_its_own_exp() -> None:
    """expires_in counts from when the token was asked for; a JWT's `exp` (the upstream's clock, whole
    seconds) ends it sooner when it says so; an opaque token without expires_in has no known expiry."""
    assert expiry(Issued("opaque", None, 5.0, ()), sent_at=1000.0) == 1005.0
    assert expiry(Issued(_jwt({"exp": 1004}), None, 5.0, ()), sent_at=1000.4) == 1004.0
    assert expiry(Issued(_jwt({"exp": 1009}), None, 5.0, ()), sent_at=1000.0) == 1005.0
    assert expiry(Issued(_jwt({"exp": 1009}), None, None, ()), sent_at=1000.0) == 1009.0
    assert expiry(Issued("opaque", None, None, ()), sent_at=1000.0) == 0.0


def test_a_token_is_not_usable_within_the_send_margin_of_its_expiry() -> None:
    """A token is not handed to a call in the last share of its lifetime that its send margin is (it would
    expire on its way, or wait past its expiry on a stalled host): a five-second token's last second, an hour's
    token's last minute (the cap), and the last SEND_MARGIN_S of one whose start is not known."""
    short = TokenSet("at", None, expires_at=100.0, obtained_at=95.0)
    assert short.usable(98.99) and not short.usable(99.01)
    hour = TokenSet("at", None, expires_at=5000.0, obtained_at=1400.0)
    assert hour.usable(5000.0 - MAX_SEND_MARGIN_S - 0.01) and not hour.usable(5000.0 - MAX_SEND_MARGIN_S + 0.01)
    unknown = TokenSet("at", None, expires_at=100.0)
    assert unknown.usable(100.0 - SEND_MARGIN_S - 0.01) and not unknown.usable(100.0 - SEND_MARGIN_S + 0.01)
    assert TokenSet("at").usable(1e12)  # no expiry: always
