"""End users' tokens, end to end: a real authorization server (oidc-provider), a protected upstream that
validates its JWTs, two workers, a gateway, and a scripted browser that consents."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx2
import pytest
import redis

from tests.support.vault_stack import (
    ALICE_TOKEN,
    BOB_TOKEN,
    AGENT,
    VaultStack,
    bearer,
    consent,
    link_in,
    vault_stack,
)
from worker.constants import AUDIT_STREAM_KEY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
__all__ = ["vault_stack"]


def rest_call(stack: VaultStack, token: str, tool: str = "whoami") -> dict:
    answer = httpx2.post(stack.url + "/v1/calls", json={"tool": tool, "arguments": {}}, headers=bearer(token), timeout=60)
    assert answer.status_code == 200, answer.text
    envelope: dict = answer.json()
    return envelope


def connect(stack: VaultStack, token: str, login: str) -> None:
    """Call once (67 with a link), consent in the browser as `login`."""
    first = rest_call(stack, token)
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
