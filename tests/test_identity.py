"""Identity at the gateway, unit by unit: the access file, grants and scoped snapshots, the issuer's key cache,
the Guard's answers, the audit trail's times."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import fakeredis
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from worker.cli import main
from worker.constants import AUDIT_STREAM_KEY
from worker.definitions.model import RequestTemplate, Tool, ToolSet, Upstream
from worker.definitions.templates import Template
from worker.gateway.catalog import Snapshot
from worker.gateway.identity.audit import AuditTrail, Record, read, since_ms
from worker.gateway.identity.oauth import IssuerKeys, JwtVerifier, metadata_urls
from worker.gateway.identity.principals import (
    EVERYTHING,
    Grant,
    OAuthSpec,
    Principal,
    access_problems,
    load_access,
    static_tokens,
)
from worker.gateway.identity.security import Gatekeeper, Refusal
from worker.gateway.mcp import discovery
from worker.settings import Settings

ISSUER = "http://127.0.0.1:9/"
AUDIENCE = "http://127.0.0.1:8/mcp"


def _tool(name: str, *tags: str) -> Tool:
    return Tool(name, "u", RequestTemplate(method="GET"), f"The {name} tool.", tags)


def _snapshot() -> Snapshot:
    tools = {t.name: t for t in (_tool("a_read", "read"), _tool("b_write", "write"), _tool("c_both", "read", "write"))}
    return Snapshot(3, ToolSet({"u": Upstream("u", Template.literal("http://127.0.0.1:1"))}, tools))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "access.yaml"
    path.write_text(text)
    return path


# --- the access file ---------------------------------------------------------------------------------


def test_the_access_file_names_tokens_with_tenants_and_grants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Named tokens from `${env:}` and `${file:}`, each with its tenant and grant; the legacy tokens as token-N."""
    secret = tmp_path / "ops-token"
    secret.write_text("ops-secret-value\n")
    monkeypatch.setenv("CI_BOT_TOKEN", "ci-secret-value")
    access = load_access(
        _write(
            tmp_path,
            f"""
tokens:
  ci-bot: {{token: "${{env:CI_BOT_TOKEN}}", tenant: ci, tags: [read]}}
  ops: {{token: "${{file:{secret}}}", tools: ["*"], grants: [operate, approve]}}
  all-tools: {{token: all-tools-value, tools: ["*"]}}
  approver: {{token: approver-value, grants: [approve]}}
""",
        )
    )
    tokens = static_tokens(Settings(gateway_tokens="legacy-1,legacy-2"), access)
    assert tokens.match(b"ci-secret-value") == Principal("ci-bot", "ci", Grant(tags=frozenset({"read"})))
    assert tokens.match(b"ops-secret-value") == Principal("ops", "default", EVERYTHING)
    all_tools = tokens.match(b"all-tools-value")
    assert all_tools is not None and all_tools.grant.everything
    assert not all_tools.grant.may("approve") and not all_tools.grant.may("operate")
    approver = tokens.match(b"approver-value")
    assert approver is not None and approver.grant.may("approve") and not approver.grant.may("operate")
    assert not approver.grant.allows(_tool("a_read", "read"))
    assert tokens.match(b"legacy-2") == Principal("token-2", "default", EVERYTHING)
    assert tokens.match(b"ci-secret-valu") is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("oauth: {issuer: 'http://127.0.0.1:9', algorithms: [none]}", "algorithms"),
        ("oauth: {issuer: 'http://127.0.0.1:9', algorithms: [HS256]}", "not HS256"),
        ("tokens: {bot: {token: abc}}", "grants nothing"),
        ("tokens: {bot: {token: abc, tools: ['*'], grants: [root]}}", "grants.0"),
        ("tokens: {bot: {token: abc, tools: ['*'], tenant: 'a b'}}", "tenant"),
        ("tokens: {bot: {token: '${env:TEST_UNSET_TOKEN}', tools: ['*']}}", "TEST_UNSET_TOKEN is not available"),
        ("oauth: {issuer: 'http://127.0.0.1:9'}", "TOOLWORKER_GATEWAY_PUBLIC_URL"),
        ("oauth: {issuer: 'http://127.0.0.1:9', scopes: {s: {tagz: [x]}}}", "tagz"),
        ("tokens: [", "not YAML"),
    ],
)
def test_a_bad_access_file_is_named_with_its_problem(tmp_path: Path, text: str, problem: str) -> None:
    """Each mistake in the access file is a problem that says what is wrong (and no secret's value)."""
    problems = access_problems(Settings(gateway_access=_write(tmp_path, text)))
    assert len(problems) == 1 and problem in problems[0], problems


def test_validate_checks_the_access_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`toolworker validate` counts the access file's problems with the definitions' ones."""
    definitions = Path(__file__).parent / "fixtures" / "gateway"
    monkeypatch.setenv("TOOLWORKER_DEFINITIONS", str(definitions))
    monkeypatch.setenv("TEST_UPSTREAM_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("TOOLWORKER_GATEWAY_ACCESS", str(_write(tmp_path, "tokens: {bot: {token: abc}}")))
    from worker.settings import get_settings

    get_settings.cache_clear()
    assert main(["validate", str(definitions)]) == 1
    assert "tokens.bot grants nothing" in capsys.readouterr().err
    monkeypatch.setenv("TOOLWORKER_GATEWAY_ACCESS", str(_write(tmp_path, "tokens: {bot: {token: abc, tags: [x]}}")))
    get_settings.cache_clear()
    assert main(["validate", str(definitions)]) == 0
    get_settings.cache_clear()


# --- grants and what they show -----------------------------------------------------------------------


def test_a_scoped_snapshot_holds_only_the_granted_tools() -> None:
    """By tag, by name, `*`: the view has those tools and no other, and is built once per grant."""
    snapshot = _snapshot()
    by_tag = snapshot.scoped(Grant(tags=frozenset({"write"})))
    assert by_tag.names == ("b_write", "c_both")
    assert snapshot.scoped(Grant(tags=frozenset({"write"}))) is by_tag
    assert snapshot.scoped(Grant(tools=frozenset({"a_read"}))).names == ("a_read",)
    assert snapshot.scoped(EVERYTHING) is snapshot
    assert by_tag.tool("a_read") is None and by_tag.tags() == {"read": 1, "write": 2}


def test_discovery_answers_from_the_principals_view() -> None:
    """The meta-tools of discovery mode list, search and describe only granted tools."""
    snapshot = _snapshot()
    snapshot.mcp_tools(list(snapshot.names))  # the full catalog's entries built first: none may leak
    view = snapshot.scoped(Grant(tags=frozenset({"read"})))
    schemas = json.loads(discovery.answer("get_tool_schema", {"names": ["a_read", "b_write"]}, view))
    assert [t["name"] for t in schemas["tools"]] == ["a_read"] and schemas["missing"] == ["b_write"]
    listed = json.loads(discovery.answer("list_tools", {}, view))
    assert [t["name"] for t in listed["tools"]] == ["a_read", "c_both"]
    found = json.loads(discovery.answer("search_tools", {"question": "b_write"}, view))
    assert "b_write" not in {t["name"] for t in found}


# --- the issuer's keys -------------------------------------------------------------------------------


def _jwks(*kids: str) -> jwt.PyJWKSet:
    keys = []
    for kid in kids:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
        keys.append({**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key)), "kid": kid, "alg": "RS256", "use": "sig"})
    return jwt.PyJWKSet.from_dict({"keys": keys})


async def test_an_unknown_kid_refetches_the_keys_at_most_once_per_interval() -> None:
    """A stream of made-up kids costs one fetch per `jwks_refetch_min_seconds`; a new kid is found after it."""
    spec = OAuthSpec(issuer=ISSUER, jwks_refetch_min_seconds=3600)
    keys = IssuerKeys(spec)
    published = [_jwks("k1"), _jwks("k1", "k2")]
    keys._fetch = lambda: published[min(keys.fetches, 1)]  # type: ignore[method-assign]
    assert (await keys.key("k1")).key_id == "k1"
    for _ in range(5):
        with pytest.raises(Exception, match="key the issuer does not publish"):
            await keys.key("made-up")
    assert keys.fetches == 1
    keys._fetched_at -= 3600  # the interval has passed
    assert (await keys.key("k2")).key_id == "k2"
    assert keys.fetches == 2


def test_the_metadata_is_looked_for_where_rfc_8414_and_openid_put_it() -> None:
    """An issuer with a path: the RFC 8414 well-known path goes before it, OpenID's after it."""
    assert metadata_urls("https://idp.example/tenant-1/") == [
        "https://idp.example/.well-known/oauth-authorization-server/tenant-1",
        "https://idp.example/tenant-1/.well-known/openid-configuration",
    ]


def test_claims_name_the_principal_tenant_and_grant() -> None:
    """`sub` (or the configured claim), the tenant claim, and the union of what the scopes grant."""
    spec = OAuthSpec.model_validate(
        {
            "issuer": ISSUER,
            "principal_claim": "client_id",
            "tenant_claim": "org",
            "scopes": {"s.read": {"tags": ["read"]}, "s.one": {"tools": ["b_write"]}, "s.ok": {"grants": ["approve"]}},
        }
    )
    verifier = JwtVerifier(spec, AUDIENCE)
    claims = {"client_id": "bot-7", "org": "acme", "scope": "s.read s.one unknown"}
    assert verifier.principal_of(claims) == Principal(
        "bot-7", "acme", Grant(frozenset({"b_write"}), frozenset({"read"}))
    )
    approver = verifier.principal_of({"client_id": "bot-7", "scope": "s.read s.ok"})
    assert approver.grant.may("approve") and not approver.grant.may("operate")
    assert verifier.principal_of({"client_id": "bot-8", "scp": ["s.read"]}).tenant == "default"
    with pytest.raises(Exception, match="not a tenant name"):
        verifier.principal_of({"client_id": "bot-9", "org": "a b"})


# --- the Guard's answers -----------------------------------------------------------------------------


async def test_a_principal_with_no_grant_is_refused_with_insufficient_scope() -> None:
    """A valid access token whose scopes grant nothing: 403 naming the scopes that would."""
    spec = OAuthSpec.model_validate({"issuer": ISSUER, "scopes": {"s.read": {"tags": ["read"]}}})
    verifier = JwtVerifier(spec, AUDIENCE)

    async def principal(token: str) -> Principal:
        return Principal("nobody", grant=Grant())

    verifier.principal = principal  # type: ignore[method-assign]
    keeper = Gatekeeper(static_tokens(Settings(), None), verifier, "http://127.0.0.1:8/.well-known/x")
    refusal = await keeper.admit(b"Bearer a.b.c")
    assert isinstance(refusal, Refusal) and refusal.status == 403
    header = dict(refusal.headers)[b"www-authenticate"].decode()
    assert 'error="insufficient_scope"' in header and 'scope="s.read"' in header
    assert 'resource_metadata="http://127.0.0.1:8/.well-known/x"' in header


# --- the audit trail ---------------------------------------------------------------------------------


async def test_audit_records_share_a_round_trip_and_read_back_by_principal() -> None:
    """Records of one tick are written together, the stream stays capped, and `read` filters by principal."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeAsyncRedis(server=server)
    trail = AuditTrail(client, maxlen=1000)
    for n in range(3):
        trail.record(Record("2026-01-01T00:00:00Z", f"p{n % 2}", "t", "tool", f"id-{n}", 0, 1.5))
    await trail.drain()
    assert await client.xlen(AUDIT_STREAM_KEY) == 3
    assert [r["callId"] for r in read(fakeredis.FakeRedis(server=server), "p0")] == ["id-0", "id-2"]
    await client.aclose()


def test_since_takes_times_and_ages() -> None:
    """ISO 8601 (UTC when no zone) and ages in s/m/h/d; anything else is a clear error."""
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert since_ms("2h", now) == int(datetime(2026, 5, 1, 10, 0, tzinfo=UTC).timestamp() * 1000)
    assert since_ms("2026-05-01T11:00:00", now) == since_ms("2026-05-01T11:00:00Z", now)
    with pytest.raises(ValueError, match="ISO 8601"):
        since_ms("yesterday", now)


def test_audit_cli_refuses_a_bad_since(capsys: pytest.CaptureFixture[str]) -> None:
    """`toolworker audit --since soon` exits 64 saying what it takes."""
    assert main(["audit", "--since", "soon"]) == 64
    assert "ISO 8601" in capsys.readouterr().err


async def test_a_verified_token_is_kept_until_it_expires() -> None:
    """The same token again is not verified again while it lives; once expired it is checked anew."""
    spec = OAuthSpec.model_validate({"issuer": ISSUER, "scopes": {"s": {"tools": ["*"]}}})
    verifier = JwtVerifier(spec, AUDIENCE)
    checked: list[str] = []
    lives_s = [3600.0, -1.0, -1.0]

    async def claims(token: str) -> dict[str, object]:
        checked.append(token)
        return {"sub": "bot", "scope": "s", "exp": time.time() + lives_s[len(checked) - 1]}

    verifier.claims = claims  # type: ignore[method-assign]
    for _ in range(3):
        assert (await verifier.principal("token-a")).name == "bot"
    assert checked == ["token-a"]
    await verifier.principal("token-b")  # expired by the time it is sent again: checked anew
    await verifier.principal("token-b")
    assert checked == ["token-a", "token-b", "token-b"]


async def test_an_issuer_that_cannot_be_reached_is_503_and_asked_once_an_interval() -> None:
    """Keys that cannot be fetched are the gateway's trouble, not the token's: 503, and no fetch per request."""
    spec = OAuthSpec(issuer=ISSUER, jwks_refetch_min_seconds=3600)
    keys = IssuerKeys(spec)

    def down() -> jwt.PyJWKSet:
        raise jwt.PyJWKClientConnectionError("connection refused")

    keys._fetch = down  # type: ignore[method-assign]
    keeper = Gatekeeper(static_tokens(Settings(), None), JwtVerifier(spec, AUDIENCE, keys))
    parts = (b'{"alg":"RS256","kid":"k1"}', b'{"sub":"x"}', b"signature")
    token = b".".join(jwt.utils.base64url_encode(part) for part in parts)
    for _ in range(3):
        refusal = await keeper.admit(b"Bearer " + token)
        assert isinstance(refusal, Refusal) and refusal.status == 503
    assert keys.fetches == 1


def test_the_gateway_does_not_start_on_a_bad_access_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A gateway whose access file is wrong exits 78 (configuration) saying what is wrong, before it listens."""
    from worker.gateway.app import serve
    from worker.gateway.mcp.server import Options

    settings = Settings(gateway_access=_write(tmp_path, "oauth: {issuer: 'http://127.0.0.1:9', algorithms: [none]}"))
    assert serve(settings, Options(), port=0) == 78
    assert "algorithms" in capsys.readouterr().err
