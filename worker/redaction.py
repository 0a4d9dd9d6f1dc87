"""What counts as a secret, and how it is hidden: header and key names, values, passwords in URLs."""

from __future__ import annotations

import re
from collections.abc import Iterable

from worker.constants import REDACTED, SECRET_NAME_PATTERN

_SECRET_NAME = re.compile(SECRET_NAME_PATTERN, re.IGNORECASE)
# The password of a URL (also each of a `;`-separated Sentinel list).
_URL_PASSWORD = re.compile(r"(://[^:/@;]*:)[^@;]*@")
# Secrets shorter than this are redacted in headers but not searched for inside texts.
MIN_SECRET_LEN = 4


def is_secret_name(name: str) -> bool:
    """A header name or log key that holds a secret (token, secret, key, auth, password, cookie, ...)."""
    return bool(_SECRET_NAME.search(name))


def is_secret_header(name: str) -> bool:
    return name.lower() == "authorization" or is_secret_name(name)


def redact(text: str, secrets: Iterable[str]) -> str:
    """The text with every secret value of at least MIN_SECRET_LEN characters replaced, longest first."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LEN and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def mask_url(url: str) -> str:
    """The URL with any password masked, fit to print (`redis://:***@host:6379/0`)."""
    return _URL_PASSWORD.sub(r"\1***@", url)
