"""Shards: several Redis deployments, each carrying the calls of some tenants (TOOLWORKER_REDIS_SHARDS).

    TOOLWORKER_REDIS_SHARDS="s1=redis://h1:6379/0 s2=sentinel://h2:26379;sentinel://h3:26379/0"

A tenant lives on one shard, chosen by rendezvous hashing of the tenant's name over the shard names
(the shard whose digest of `shard name + tenant` is highest): every process places a tenant alike,
whatever the order of the list, and a shard added takes about 1/N of the tenants, each from wherever it
was, to the new shard only. A tenant's queue, in-flight lists, leases, results, reply-stream entries,
parked calls and webhook records are on its shard; what concerns an upstream or the whole fleet (rate
limits, circuits, OAuth tokens, the vault, the cache, the shared definitions, the audit trail) is on the
first shard, the *home* one. Without the variable there is one shard, TOOLWORKER_REDIS_URL, and nothing
changes. A worker process takes from one shard (TOOLWORKER_SHARD, set by `toolworker worker` for each
process it starts: worker/queue/supervisor.py).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from worker.redaction import mask_url

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_SCHEMES = ("redis", "rediss", "unix", "sentinel")


@dataclass(frozen=True)
class Shard:
    name: str  # "" for the single Redis of TOOLWORKER_REDIS_URL
    url: str

    @property
    def where(self) -> str:
        """How errors name the shard: its name and address, or the one Redis's URL (never a password)."""
        return f"shard {self.name} ({_address(self.url)})" if self.name else mask_url(self.url)


class Shards:
    """The shards of a deployment, in the order given: the first is the home shard."""

    def __init__(self, shards: list[Shard]) -> None:
        if not shards:
            raise ValueError("no shard given")
        self.all = shards
        self.home = shards[0]
        self._by_name = {shard.name: shard for shard in shards}

    @classmethod
    def parse(cls, text: str) -> Shards:
        """`name=url` pairs separated by spaces or commas; a name is 1-32 of [A-Za-z0-9_.-], each once."""
        shards: list[Shard] = []
        for item in text.replace(",", " ").split():
            name, found, url = item.partition("=")
            if not found or not _NAME.match(name):
                raise ValueError(f"{mask_url(item)!r} is not name=url (a name is 1-32 of A-Z a-z 0-9 _ . -)")
            if urlsplit(url).scheme.lower() not in _SCHEMES:
                schemes = ", ".join(f"{scheme}://" for scheme in _SCHEMES)
                raise ValueError(f"shard {name}: {mask_url(url)!r} is not a URL of {schemes}")
            if any(shard.name == name for shard in shards):
                raise ValueError(f"shard {name} is named twice")
            shards.append(Shard(name, url))
        if not shards:
            raise ValueError("no shard given")
        return cls(shards)

    @classmethod
    def single(cls, url: str) -> Shards:
        return cls([Shard("", url)])

    @property
    def sharded(self) -> bool:
        return bool(self.home.name)

    def named(self, name: str) -> Shard:
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(f"no shard named {name!r} in TOOLWORKER_REDIS_SHARDS") from None

    def of(self, tenant: str) -> Shard:
        """The tenant's shard (rendezvous hashing: the same in every process)."""
        if len(self.all) == 1:
            return self.home
        return max(self.all, key=lambda shard: _weight(shard.name, tenant))


def _weight(shard: str, tenant: str) -> bytes:
    return hashlib.blake2b(f"{shard}\0{tenant}".encode(), digest_size=8).digest()


def _address(url: str) -> str:
    """host:port of each server a URL names (unix: its path)."""
    parts = []
    for part in url.split(";"):
        parsed = urlsplit(part.strip())
        if parsed.scheme == "unix":
            parts.append(parsed.path)
        else:
            parts.append(f"{parsed.hostname}:{parsed.port or (26379 if parsed.scheme == 'sentinel' else 6379)}")
    return ",".join(parts)
