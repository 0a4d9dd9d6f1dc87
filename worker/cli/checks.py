"""What commands check before they start: the settings' Redis answers, the vault's keys parse."""

from __future__ import annotations

import sys

from worker.connections import check_reachable
from worker.settings import Settings


def check_redis(settings: Settings) -> None:
    """Fail fast, saying why, when the settings cannot work (wrong password, nothing listening)."""
    check_reachable(settings.redis_url, settings.redis_connect_timeout_seconds)


def vault_keys_usable(settings: Settings) -> bool:
    """TOOLWORKER_VAULT_KEYS parses (or is empty); else says why, on stderr."""
    from worker.call.vault import Keyring, VaultKeyError

    try:
        Keyring.parse(settings.vault_keys.get_secret_value())
    except VaultKeyError as exc:
        print(f"toolworker: {exc}", file=sys.stderr)
        return False
    return True
