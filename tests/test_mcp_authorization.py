"""Authorization discovery as the MCP specification's client (worker/mcp_client/authorization.py), driven at its
fetch seam: which URLs it reads in which order, what it takes from them, and what it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker import errors
from worker.http.egress import EgressPolicy
from worker.mcp_client.authorization import Challenge, Discovered, Guard, discover

SERVER = "https://mcp.example.com/mcp"
ISSUER = "https://auth.example.com"
PRM_URL = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"


def server_metadata(**changes: Any) -> dict[str, Any]:
    return {
        "issuer": ISSUER,
        "authorization_endpoint": f"{ISSUER}/authorize",
        "token_endpoint": f"{ISSUER}/token",
        "registration_endpoint": f"{ISSUER}/register",
        "code_challenge_methods_supported": ["S256"],
        "scopes_supported": ["tools.read", "offline_access"],
        **changes,
    }


class Documents:
    """A fetch that answers from a table and remembers every URL it was asked for."""

    def __init__(self, table: dict[str, dict[str, Any]]) -> None:
        self.table = table
        self.fetched: list[str] = []

    async def __call__(self, url: str) -> tuple[int, bytes]:
        self.fetched.append(url)
        document = self.table.get(url)
        return (404, b"") if document is None else (200, json.dumps(document).encode())


def guard(allow: str = "auth.example.com") -> Guard:
    return Guard(EgressPolicy.parse(allow), SERVER, "files")


def resource_metadata(**changes: Any) -> dict[str, Any]:
    return {"resource": SERVER, "authorization_servers": [ISSUER], **changes}


def test_challenge_reads_resource_metadata_scope_and_error() -> None:
    """The WWW-Authenticate fields a 401 or 403 carries are read by name."""
    header = 'Bearer error="insufficient_scope", scope="files.read files.write", resource_metadata="https://m/prm"'
    assert Challenge.of(403, header) == Challenge("https://m/prm", "files.read files.write", "insufficient_scope")
    assert Challenge.of(401, None) == Challenge()


async def test_discovery_follows_the_well_known_urls_path_aware_first() -> None:
    """Without a header URL the path-aware PRM URL is read first, then RFC 8414 at the issuer."""
    fetch = Documents(
        {
            "https://mcp.example.com/.well-known/oauth-protected-resource": resource_metadata(),
            f"{ISSUER}/.well-known/oauth-authorization-server": server_metadata(),
        }
    )
    found = await discover(fetch, guard(), SERVER, Challenge())
    assert fetch.fetched == [
        PRM_URL,
        "https://mcp.example.com/.well-known/oauth-protected-resource",
        f"{ISSUER}/.well-known/oauth-authorization-server",
    ]
    assert (found.authorization_url, found.token_url) == (f"{ISSUER}/authorize", f"{ISSUER}/token")
    assert found.registration_url == f"{ISSUER}/register"
    assert found.resource == SERVER


async def test_the_header_url_comes_first_and_openid_discovery_is_a_fallback() -> None:
    """The 401's resource_metadata is read before the well-known URLs; OpenID discovery when RFC 8414 is absent."""
    issuer = "https://auth.example.com/tenant"
    fetch = Documents(
        {
            "https://mcp.example.com/prm": resource_metadata(authorization_servers=[issuer]),
            "https://auth.example.com/.well-known/openid-configuration/tenant": server_metadata(issuer=issuer),
        }
    )
    found = await discover(fetch, guard(), SERVER, Challenge("https://mcp.example.com/prm", "files.read"))
    assert fetch.fetched == [
        "https://mcp.example.com/prm",
        "https://auth.example.com/.well-known/oauth-authorization-server/tenant",
        "https://auth.example.com/.well-known/openid-configuration/tenant",
    ]
    assert found.issuer == issuer


async def test_scopes_from_the_challenge_else_the_metadata_with_offline_access_only_when_offered() -> None:
    """The 401's scope wins; else scopes_supported; offline_access is added for users only where offered."""
    table = {PRM_URL: resource_metadata(), f"{ISSUER}/.well-known/oauth-authorization-server": server_metadata()}
    found = await discover(Documents(table), guard(), SERVER, Challenge(scope="files.read"))
    assert (found.scopes, found.service_scopes) == (("files.read", "offline_access"), ("files.read",))
    table[PRM_URL] = resource_metadata(scopes_supported=["files.read", "files.write"])
    table[f"{ISSUER}/.well-known/oauth-authorization-server"] = server_metadata(scopes_supported=None)
    found = await discover(Documents(table), guard(), SERVER, Challenge())
    assert found.scopes == ("files.read", "files.write")
    table[PRM_URL] = resource_metadata()
    assert (await discover(Documents(table), guard(), SERVER, Challenge())).scopes == ()


async def test_another_issuer_in_the_metadata_is_refused() -> None:
    """Metadata naming an issuer other than the one the resource named ends the call with 78."""
    table = {
        PRM_URL: resource_metadata(),
        f"{ISSUER}/.well-known/oauth-authorization-server": server_metadata(issuer="https://evil.example.com"),
    }
    with pytest.raises(errors.ToolMisconfigured, match="another issuer"):
        await discover(Documents(table), guard(), SERVER, Challenge())


async def test_a_server_without_pkce_s256_is_refused() -> None:
    """An authorization server whose metadata does not offer S256 is not used."""
    metadata = server_metadata(code_challenge_methods_supported=["plain"])
    table = {PRM_URL: resource_metadata(), f"{ISSUER}/.well-known/oauth-authorization-server": metadata}
    with pytest.raises(errors.ToolMisconfigured, match="PKCE S256"):
        await discover(Documents(table), guard(), SERVER, Challenge())


async def test_metadata_for_another_resource_is_refused() -> None:
    """Protected Resource Metadata that names another resource is not believed."""
    table = {PRM_URL: resource_metadata(resource="https://other.example.com/mcp")}
    with pytest.raises(errors.ToolMisconfigured, match="another resource"):
        await discover(Documents(table), guard(), SERVER, Challenge())


async def test_a_refused_address_is_never_fetched_and_named_in_the_77() -> None:
    """Discovery pointing at 127.0.0.2 ends with 77 naming that origin, and nothing asks it for anything."""
    fetch = Documents({PRM_URL: resource_metadata(authorization_servers=["http://127.0.0.2:9000"])})
    with pytest.raises(errors.EgressBlocked, match=r"http://127\.0\.0\.2:9000") as raised:
        await discover(fetch, guard(), SERVER, Challenge())
    assert raised.value.exit_code == 77
    assert fetch.fetched == [PRM_URL]


async def test_a_header_url_off_the_servers_origin_passes_the_policy_first() -> None:
    """A resource_metadata URL on another origin is checked before it is read; the server's own is not."""
    fetch = Documents({})
    with pytest.raises(errors.EgressBlocked, match=r"http://127\.0\.0\.2"):
        await discover(fetch, guard(), SERVER, Challenge("http://127.0.0.2/prm"))
    assert fetch.fetched == []


async def test_an_endpoint_the_fleet_would_post_to_passes_the_policy() -> None:
    """A token endpoint on a refused host is refused at discovery, before any token request."""
    metadata = server_metadata(token_endpoint="http://127.0.0.2/token")
    table = {PRM_URL: resource_metadata(), f"{ISSUER}/.well-known/oauth-authorization-server": metadata}
    with pytest.raises(errors.EgressBlocked, match=r"127\.0\.0\.2"):
        await discover(Documents(table), guard(), SERVER, Challenge())


async def test_what_discovery_found_survives_its_json() -> None:
    """The discovered endpoints are stored as JSON and read back equal."""
    table = {PRM_URL: resource_metadata(), f"{ISSUER}/.well-known/oauth-authorization-server": server_metadata()}
    found = await discover(Documents(table), guard(), SERVER, Challenge(scope="files.read"))
    assert Discovered.from_json(found.to_json()) == found
