"""A call as the client writes it: the checks the workers would otherwise refuse it for (65), and the
message's fields (the call's own, and those every call of one submission shares). With vault keys
(TOOLWORKER_VAULT_KEYS) a call's headers travel sealed (worker/sealing.py): only a worker opens them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from worker import tracing
from worker.constants import DEFAULT_TENANT, MAX_CALL_TIMEOUT_S, TENANT_PATTERN
from worker.sealing import SEALED_HEADERS_FIELD, Keyring, seal_headers

CallSpec = tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], Mapping[str, str]]


def check_timeout(timeout: float) -> None:
    if not 0 < timeout <= MAX_CALL_TIMEOUT_S:  # the workers would refuse the call (65)
        raise ValueError(f"timeout must be more than 0 and at most {MAX_CALL_TIMEOUT_S:g} seconds, got {timeout!r}")


def checked_user(user: str) -> str:
    """A user name as a call may carry it (1 to 256 characters)."""
    if not isinstance(user, str) or not 0 < len(user) <= 256:
        raise ValueError("user must be a string of 1 to 256 characters")
    return user


def checked_tenant(tenant: str) -> str:
    """A tenant name as the workers accept it (else they would refuse the call with 65)."""
    if not re.fullmatch(TENANT_PATTERN, tenant):
        raise ValueError(f"tenant must match {TENANT_PATTERN}, got {tenant!r}")
    return tenant


def common_fields(
    timeout: float,
    reply_to: str,
    trace: Mapping[str, str] | None,
    tenant: str,
    principal: str | None,
    user: str | None,
    callback_url: str | None,
    relay: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields every call of one submission carries."""
    now = datetime.now(UTC)
    common: dict[str, Any] = {
        "timeoutSeconds": timeout,
        "deadline": (now + timedelta(seconds=timeout)).isoformat(),
        "enqueuedAt": now.isoformat(),
        "replyTo": reply_to,
        **(tracing.current_context() or trace or {}),
    }
    optional = {
        "tenant": None if tenant == DEFAULT_TENANT else tenant,
        "principal": principal,
        "user": None if user is None else checked_user(user),
        "callback": None if callback_url is None else {"url": callback_url},
        "relay": dict(relay) if relay else None,
    }
    return common | {key: value for key, value in optional.items() if value is not None}


def message(spec: CallSpec, call_id: str, common: Mapping[str, Any], keyring: Keyring) -> dict[str, Any]:
    """The call object; its headers (they may carry a user's credential) sealed when vault keys are set."""
    tool, arguments = spec[0], spec[1]
    headers: Mapping[str, str] = spec[2] if len(spec) > 2 else {}
    written: dict[str, Any] = {"callId": call_id, "tool": tool, "arguments": dict(arguments), **common}
    if headers and keyring:
        written[SEALED_HEADERS_FIELD] = seal_headers(keyring, headers, call_id)
    elif headers:
        written["headers"] = dict(headers)
    return written
