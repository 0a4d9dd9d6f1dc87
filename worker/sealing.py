"""Sealing with the vault's keys (TOOLWORKER_VAULT_KEYS): AES-GCM, each record naming the key that sealed it
and bound to a context (associated data) so that it opens nowhere else.

The vault (worker/call/vault.py) seals end users' token sets with it; a producer seals a call's headers
with it (`seal_headers`), so that a per-call credential is never on the queue, in a parked call or in a
dead letter in clear: only the worker that sends the call opens them (`open_headers`), in memory.

    {"kid": "k1", "nonce": BASE64, "data": BASE64}    a sealed record (JSON text)
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable, Mapping

import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = structlog.get_logger("toolworker.vault")

_KEY_BYTES = 32
_NONCE_BYTES = 12
# The call field that holds a call's headers, sealed (in place of `headers`).
SEALED_HEADERS_FIELD = "sealedHeaders"
_HEADERS_CONTEXT = "toolworker:call-headers:"


class VaultKeyError(ValueError):
    """TOOLWORKER_VAULT_KEYS is not a list of `kid:BASE64(32 bytes)`."""


class VaultLocked(Exception):
    """No key is configured: the vault cannot be read or written."""


class Keyring:
    """The AES-GCM keys by id; the first seals."""

    def __init__(self, keys: Iterable[tuple[str, bytes]]) -> None:
        self._keys = {kid: AESGCM(key) for kid, key in keys}
        self.sealing = next(iter(self._keys), None)

    @classmethod
    def parse(cls, text: str) -> Keyring:
        keys = []
        for item in (i.strip() for i in text.split(",") if i.strip()):
            kid, sep, encoded = item.partition(":")
            try:
                key = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                key = b""
            if not sep or not kid or len(key) != _KEY_BYTES:
                raise VaultKeyError(f"TOOLWORKER_VAULT_KEYS: {kid or '?'!r} is not `kid:BASE64(32 bytes)`")
            keys.append((kid, key))
        return cls(keys)

    def __bool__(self) -> bool:
        return self.sealing is not None

    def seal(self, plaintext: bytes, context: str) -> str:
        if self.sealing is None:
            raise VaultLocked("TOOLWORKER_VAULT_KEYS is not set: end users' tokens cannot be stored.")
        nonce = os.urandom(_NONCE_BYTES)
        data = self._keys[self.sealing].encrypt(nonce, plaintext, context.encode())
        record = {"kid": self.sealing, "nonce": _b64(nonce), "data": _b64(data)}
        return json.dumps(record)

    def open(self, sealed: bytes | str, context: str) -> bytes | None:
        """The plaintext, or None when no key of the ring opens it (logged, without the record)."""
        try:
            record = json.loads(sealed)
            key = self._keys.get(record["kid"])
            if key is not None:
                return key.decrypt(
                    base64.b64decode(record["nonce"]), base64.b64decode(record["data"]), context.encode()
                )
        except (ValueError, KeyError, TypeError, InvalidTag):
            pass
        log.warning("vault.record_unreadable", record=context, reason="no configured key opens it")
        return None

    def sealed_with_current(self, sealed: bytes | str) -> bool:
        try:
            return bool(json.loads(sealed).get("kid") == self.sealing)
        except (ValueError, AttributeError):
            return False


def seal_headers(keyring: Keyring, headers: Mapping[str, str], call_id: str) -> str:
    """A call's headers as one sealed record, bound to its callId (it opens for no other call)."""
    return keyring.seal(json.dumps(dict(headers)).encode(), _HEADERS_CONTEXT + call_id)


def open_headers(keyring: Keyring, sealed: str, call_id: str) -> dict[str, str] | None:
    """The headers `seal_headers` sealed for this call; None when no key of the ring opens them."""
    plaintext = keyring.open(sealed, _HEADERS_CONTEXT + call_id)
    if plaintext is None:
        return None
    headers = json.loads(plaintext)
    return {str(name): str(value) for name, value in headers.items()} if isinstance(headers, dict) else None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
