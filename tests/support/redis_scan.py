"""Every value a Redis holds, read by its type (strings, lists, hashes, sets, sorted sets, streams), to look
for a secret in it: as written, and inside any base64 run (a message body or a sealed record may be
base64)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator

import redis

_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{16,}={0,2}")


def values(client: redis.Redis) -> Iterator[tuple[bytes, bytes]]:
    """(key, one piece of its value) for every key, whatever its type."""
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        for piece in _pieces(client, key, kind):
            yield key, piece


def _pieces(client: redis.Redis, key: bytes, kind: str) -> list[bytes]:
    if kind == "none":  # gone since the scan named it (a lock released meanwhile): nothing left to read
        return []
    if kind == "string":
        return [client.get(key) or b""]
    if kind == "list":
        return list(client.lrange(key, 0, -1))
    if kind == "hash":
        return [item for pair in client.hgetall(key).items() for item in pair]
    if kind == "set":
        return list(client.smembers(key))
    if kind == "zset":
        return [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
    if kind == "stream":
        entries = client.xrange(key)
        return [item for _, fields in entries for pair in fields.items() for item in pair]
    raise AssertionError(f"{key!r} is a {kind}, which this scan cannot read")


def holders(client: redis.Redis, secret: str) -> list[bytes]:
    """The keys whose value shows `secret`, in the clear or base64-encoded."""
    needle = secret.encode()
    return sorted({key for key, piece in values(client) if _shows(piece, needle, depth=2)})


def _shows(data: bytes, needle: bytes, depth: int) -> bool:
    if needle in data:
        return True
    if depth == 0:
        return False
    return any(_shows(decoded, needle, depth - 1) for decoded in _decoded_runs(data))


def _decoded_runs(data: bytes) -> Iterator[bytes]:
    for run in _BASE64_RUN.findall(data):
        padded = run + b"=" * (-len(run) % 4)
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                yield decode(padded)
            except (binascii.Error, ValueError):
                continue
