"""The fleet's client identity at an MCP server's authorization server, when the upstream names no `client_id`:

    the server advertises client_id_metadata_document_supported
        └▶ client_id = {gateway}/v1/connections/clients/{upstream}.json, the document the gateway serves there
    else it has a registration_endpoint
        └▶ RFC 7591 dynamic registration, kept for the fleet and reused by every later flow:
           toolworker:mcp:client:<upstream>:<digest of issuer + redirect URI>
               {"client_id", "auth_method", "expires_at", "secret": the client secret sealed with the vault keys}
    else the operator must pre-register a client (ToolMisconfigured, 78)

A registration the authorization server rejects (`invalid_client`) is forgotten: the next flow registers again.
The secret is never logged, queued or answered; Redis holds it sealed, bound to its own key.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any
from urllib.parse import quote

import redis.asyncio as aioredis
import structlog

from worker.call.connect import CALLBACK_PATH
from worker.mcp_client.authorization import USER_GRANTS, Registered
from worker.sealing import Keyring

log = structlog.get_logger("toolworker.mcp.clients")

CLIENT_KEY_PREFIX = "toolworker:mcp:client:"
DOCUMENT_PATH = "/v1/connections/clients/{upstream}.json"
# A registration whose secret expires is registered again this long before it does.
EXPIRY_MARGIN_S = 60


def document_url(public_url: str, upstream: str) -> str:
    """The client_id an upstream's Client ID Metadata Document names: the URL the gateway serves it at."""
    return public_url.rstrip("/") + DOCUMENT_PATH.format(upstream=quote(upstream, safe=""))


def metadata_document(public_url: str, upstream: str) -> dict[str, Any]:
    """The Client ID Metadata Document of the fleet's client for one upstream: a public client (PKCE) whose
    only redirect is the gateway's connect callback."""
    return {
        "client_id": document_url(public_url, upstream),
        "client_name": f"toolworker ({upstream})",
        "redirect_uris": [public_url.rstrip("/") + CALLBACK_PATH],
        "grant_types": USER_GRANTS,
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }


class Registrations:
    """Dynamic registrations, shared by the fleet through Redis (or kept by this process without one)."""

    def __init__(self, redis: aioredis.Redis | None, keyring: Keyring) -> None:
        self._redis = redis
        self._keyring = keyring
        self._held: dict[str, Registered] = {}

    @staticmethod
    def key(upstream: str, issuer: str, redirect_uri: str) -> str:
        digest = hashlib.sha256(f"{issuer}\n{redirect_uri}".encode()).hexdigest()[:16]
        return f"{CLIENT_KEY_PREFIX}{upstream}:{digest}"

    async def get(self, key: str) -> Registered | None:
        found = await self._stored(key) if self._redis is not None else self._held.get(key)
        if found is None or (found.expires_at and found.expires_at - EXPIRY_MARGIN_S <= time.time()):
            return None
        self._held[key] = found
        return found

    async def keep(self, key: str, registered: Registered) -> Registered:
        """Keep a new registration; the one another process kept first wins (each server names one client)."""
        if self._redis is not None:
            ttl = int(registered.expires_at - time.time()) if registered.expires_at else None
            record = self._record(key, registered)
            if not await self._redis.set(key, record, ex=ttl, nx=True):
                kept = await self._stored(key)
                if kept is None:  # one no configured key opens: replaced
                    await self._redis.set(key, record, ex=ttl)
                registered = kept or registered
        self._held[key] = registered
        return registered

    async def forget(self, upstream: str) -> None:
        """The server rejected the upstream's registered client: the next flow registers again."""
        await forget_registrations(self._redis, upstream)
        self._held = {k: v for k, v in self._held.items() if not k.startswith(f"{CLIENT_KEY_PREFIX}{upstream}:")}

    def _record(self, key: str, registered: Registered) -> str:
        secret = registered.client_secret
        return json.dumps(
            {
                "client_id": registered.client_id,
                "auth_method": registered.auth_method,
                "expires_at": registered.expires_at,
                "secret": None if secret is None else self._keyring.seal(secret.encode(), key),
            }
        )

    async def _stored(self, key: str) -> Registered | None:
        text = None if self._redis is None else await self._redis.get(key)
        if text is None:
            return None
        record = json.loads(text)
        secret = None
        if record.get("secret") is not None:
            opened = self._keyring.open(record["secret"], key)
            if opened is None:  # sealed with a key no longer configured: registered again
                return None
            secret = opened.decode()
        return Registered(record["client_id"], secret, record.get("auth_method", "body"), record.get("expires_at", 0))


async def forget_registrations(redis: aioredis.Redis | None, upstream: str) -> None:
    """Drop the fleet's registrations for an upstream (its server answered `invalid_client`)."""
    if redis is None:
        return
    keys = [key async for key in redis.scan_iter(match=f"{CLIENT_KEY_PREFIX}{upstream}:*", count=100)]
    if keys:
        await redis.delete(*keys)
        log.info("mcp.client_forgotten", upstream=upstream)
