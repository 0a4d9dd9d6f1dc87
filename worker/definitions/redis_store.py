"""The Redis store: definitions published to Redis as numbered versions, so that every worker (and
client) serves one catalog, and a new version reaches running workers without a restart.

This module owns its Redis keys: the versions and bundles (DEFINITIONS_*), the routes (tool ->
bulkhead queue) that workers write and clients read, and the files that workers on the file store
announce they serve (FLEET_DEFINITIONS_KEY), which a gateway on the file store serves in turn.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import redis
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from worker.constants import (
    DEFINITIONS_BUNDLE_PREFIX,
    DEFINITIONS_CURRENT_KEY,
    DEFINITIONS_VERSION_KEY,
    FLEET_DEFINITIONS_KEY,
    ROUTES_KEY,
    TENANT_LIMITS_KEY,
)
from worker.definitions.file_store import definition_files, load
from worker.definitions.model import Problem, ToolSet

log = structlog.get_logger("toolworker.definitions")


def routes(toolset: ToolSet) -> dict[str, str]:
    """Tool -> queue for the tools whose upstream has a queue of its own."""
    return {
        name: upstream.queue
        for name, tool in toolset.tools.items()
        if (upstream := toolset.upstreams.get(tool.upstream)) is not None and upstream.queue
    }


def write_routes(client: redis.Redis, toolset: ToolSet) -> None:
    """Make this toolset's routes the ones clients use (replacing the previous map at once)."""
    table = routes(toolset)
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(ROUTES_KEY)
        if table:
            pipe.hset(ROUTES_KEY, mapping=cast(Any, table))  # redis-py types reject dict[str, str]
        pipe.execute()


def announce(client: redis.Redis, paths: list[Path], toolset: ToolSet) -> None:
    """What a worker on the file store serves, for the others to follow: its routes (clients) and its
    definitions files (gateways). Every worker of a fleet on one folder announces the same digest."""
    write_routes(client, toolset)
    files = bundle(paths)
    mapping = {"digest": files_digest(files), "files": json.dumps(files), "announcedAt": str(time.time())}
    client.hset(FLEET_DEFINITIONS_KEY, mapping=cast(Any, mapping))  # redis-py types reject dict[str, str]


def files_digest(files: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


async def announced_files(client: aioredis.Redis) -> tuple[str, dict[str, str]] | None:
    """The digest and files the workers on the file store last announced, None when none did."""
    raw: Any = await client.hmget(FLEET_DEFINITIONS_KEY, ["digest", "files"])
    if raw[0] is None or raw[1] is None:
        return None
    return raw[0].decode(), json.loads(raw[1])


async def follow_announced(
    client: aioredis.Redis,
    digest: str | None,
    poll_s: float,
    on_files: Callable[[str, dict[str, str]], Awaitable[None]],
) -> None:
    """Hand each newly announced set of files to `on_files`, for as long as the task runs; a set that
    cannot be loaded is logged and skipped, polling goes on through Redis outages."""
    while True:
        await asyncio.sleep(poll_s)
        try:
            current: Any = await client.hget(FLEET_DEFINITIONS_KEY, "digest")
            if current is None or current.decode() == digest:
                continue
            announced = await announced_files(client)
            if announced is not None:
                digest = announced[0]  # tried once: a set that fails to load is not tried again
                await on_files(*announced)
        except RedisError as exc:
            log.warning("definitions.poll_failed", error=str(exc))
        except Exception as exc:
            log.error("definitions.load_failed", digest=digest, error=f"{type(exc).__name__}: {exc}")


def write_tenants(client: redis.Redis, toolset: ToolSet) -> None:
    """Make this toolset's tenant limits the ones the fleet's takes and the clients read (replacing the
    previous ones at once): tenant -> "weight max_in_flight max_queued", 0 for none."""
    table = {
        name: f"{t.weight} {t.max_in_flight or 0} {t.max_queued or 0}" for name, t in sorted(toolset.tenants.items())
    }
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(TENANT_LIMITS_KEY)
        if table:
            pipe.hset(TENANT_LIMITS_KEY, mapping=cast(Any, table))
        pipe.execute()


async def read_routes(client: aioredis.Redis) -> dict[str, str]:
    """The routes the workers published: tool -> queue."""
    raw: Any = await client.hgetall(ROUTES_KEY)
    return {key.decode(): value.decode() for key, value in raw.items()}


def bundle(paths: list[Path]) -> dict[str, str]:
    """The definitions files below `paths`, relative path -> text (a root index prefixes several roots)."""
    files: dict[str, str] = {}
    for index, root in enumerate(paths):
        prefix = f"{index}/" if len(paths) > 1 else ""
        base = root if root.is_dir() else root.parent
        for file in definition_files([root]):
            files[prefix + file.relative_to(base).as_posix()] = file.read_text(encoding="utf-8")
    return files


def publish(client: redis.Redis, paths: list[Path], environ: Mapping[str, str] | None = None) -> tuple[int, ToolSet]:
    """Check the definitions, then make them the current version; a set with problems changes nothing.

    The files are read once: what is checked is the bundle the workers will load, so a file edited
    meanwhile cannot slip in unchecked. Problems name the files as they are on disk."""
    files = bundle(paths)
    with tempfile.TemporaryDirectory(prefix="toolworker-definitions-") as tmp:
        toolset = load([materialize(files, Path(tmp))], environ)
        toolset.problems = [_on_disk(problem, Path(tmp), paths) for problem in toolset.problems]
    if toolset.problems:
        return 0, toolset
    version = int(client.incr(DEFINITIONS_VERSION_KEY))
    payload = json.dumps({"version": version, "files": files, "publishedAt": time.time()})
    with client.pipeline(transaction=True) as pipe:
        pipe.set(DEFINITIONS_BUNDLE_PREFIX + str(version), payload)
        pipe.set(DEFINITIONS_CURRENT_KEY, version)
        pipe.execute()
    write_routes(client, toolset)
    write_tenants(client, toolset)
    return version, toolset


def _on_disk(problem: Problem, bundle_dir: Path, paths: list[Path]) -> Problem:
    """A problem found in a materialized bundle, pointing at the file it came from (see `bundle`)."""
    try:
        parts = Path(problem.source.file).relative_to(bundle_dir).parts
    except ValueError:
        return problem
    root = paths[int(parts[0])] if len(paths) > 1 else paths[0]
    base = root if root.is_dir() else root.parent
    relative = parts[1:] if len(paths) > 1 else parts
    return replace(problem, source=replace(problem.source, file=str(base.joinpath(*relative))))


def materialize(files: Mapping[str, str], directory: Path) -> Path:
    """Write a bundle's files below `directory` (relative references between them keep working)."""
    for relative, text in files.items():
        target = (directory / relative).resolve()
        if directory.resolve() not in target.parents:  # a bundle names files below its root only
            raise ValueError(f"bundle path escapes its folder: {relative!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return directory


class Bundles:
    """Published bundles as files on disk, kept while their version may be served: a large OpenAPI
    spec builds its input schemas on first use, and reads the spec's other files then."""

    KEPT_VERSIONS = 2  # the current one, and the one calls in flight may still use

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="toolworker-definitions-"))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)

    def load(self, payload: bytes | str, environ: Mapping[str, str] | None = None) -> tuple[int, ToolSet]:
        """The version and toolset of a published bundle."""
        data = json.loads(payload)
        version = int(data["version"])
        return version, self.load_files(version, data["files"], environ)

    def load_files(self, version: int, files: Mapping[str, str], environ: Mapping[str, str] | None = None) -> ToolSet:
        """The toolset of a bundle's files, kept on disk as this version."""
        directory = self.root / f"v{version}"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        toolset = load([materialize(files, directory)], environ)
        self._prune(version)
        return toolset

    def _prune(self, newest: int) -> None:
        versions = sorted(int(path.name[1:]) for path in self.root.glob("v*") if path.name[1:].isdigit())
        for version in versions[: -self.KEPT_VERSIONS]:
            if version != newest:
                shutil.rmtree(self.root / f"v{version}", ignore_errors=True)


def current_payload(client: redis.Redis) -> bytes | None:
    """The current version's bundle, None when nothing was published."""
    current = int(client.get(DEFINITIONS_CURRENT_KEY) or 0)
    payload = client.get(DEFINITIONS_BUNDLE_PREFIX + str(current)) if current else None
    return payload if isinstance(payload, bytes) else None


async def follow(
    client: aioredis.Redis,
    bundles: Bundles,
    version: int,
    poll_s: float,
    on_version: Callable[[int, ToolSet], Awaitable[None] | None],
) -> None:
    """Load each newly published version and hand it to `on_version`, for as long as the task runs. A
    version that cannot be loaded is logged and skipped (the current one stays served); polling goes on
    through Redis outages."""
    failed = 0
    while True:
        await asyncio.sleep(poll_s)
        try:
            current = int(await client.get(DEFINITIONS_CURRENT_KEY) or 0)
            if current in (0, version, failed):
                continue
            payload = await client.get(DEFINITIONS_BUNDLE_PREFIX + str(current))
            if payload is None:
                continue
            loaded, toolset = await asyncio.to_thread(bundles.load, payload)
            outcome = on_version(loaded, toolset)
            if outcome is not None:
                await outcome
            version = loaded
        except RedisError as exc:
            log.warning("definitions.poll_failed", error=str(exc))
        except Exception as exc:
            failed = current
            log.error("definitions.load_failed", version=current, error=f"{type(exc).__name__}: {exc}")
