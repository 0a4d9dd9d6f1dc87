"""The console's rules that need no browser: cookie flags, origins, sessions in Redis, dead letters by id."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
from starlette.requests import Request

from worker.constants import DEAD_LETTER_KEY, RESULT_KEY_PREFIX
from worker.gateway.console.gate import Gate
from worker.gateway.console.sessions import SESSION_PREFIX, Sessions
from worker.gateway.identity.principals import Grant, Principal, StaticTokens
from worker.queue import dead_letter
from worker.queue.dead_letter_store import DeadLetters, NoSuchItem, NotReplayable


def request(url: str, origin: str | None = None) -> Request:
    scheme, rest = url.split("://")
    host = rest.split("/")[0]
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin else [])
    scope = {
        "type": "http",
        "method": "POST",
        "scheme": scheme,
        "path": "/console/logout",
        "query_string": b"",
        "headers": headers,
        "server": (name or host, int(port) if port else (443 if scheme == "https" else 80)),
    }
    return Request(scope)


def gate(public_url: str = "") -> Gate:
    sessions = Sessions(fakeredis.aioredis.FakeRedis(), 60)
    return Gate(sessions, StaticTokens([("t0ken-ops", Principal("ops"))]), False, public_url)


@pytest.mark.parametrize(
    ("public_url", "url", "secure"),
    [
        ("", "http://127.0.0.1:8780/", False),
        ("", "http://localhost:8780/", False),
        ("", "http://console.example:8780/", True),
        ("", "https://console.example/", True),
        ("https://console.example", "http://127.0.0.1:8780/", True),
    ],
)
def test_the_cookie_is_secure_unless_plain_http_on_loopback(public_url: str, url: str, secure: bool) -> None:
    """Secure everywhere but plain http on a loopback address (and always behind an https public URL)."""
    assert gate(public_url).secure_cookie(request(url)) is secure


@pytest.mark.parametrize(
    ("public_url", "origin", "allowed"),
    [
        ("https://console.example", "https://console.example", True),
        ("https://console.example:443/", "https://console.example", True),
        ("https://console.example", "https://evil.example", False),
        ("https://console.example", "http://console.example", False),
        ("", "http://127.0.0.1:8780", True),
        ("", "http://127.0.0.1:9999", False),
        ("", None, True),
        ("http://[::1]:8780", "http://[::1]:8780", True),
    ],
)
def test_a_post_must_come_from_the_gateways_origin(public_url: str, origin: str | None, allowed: bool) -> None:
    """The Origin must be the public URL's (else the request's own); a request without one passes."""
    assert gate(public_url).same_origin(request("http://127.0.0.1:8780/", origin)) is allowed


def test_a_token_names_its_principal_and_nothing_else_does() -> None:
    """The static token signs in; another text, or nothing, does not."""
    keeper = gate()
    assert keeper.principal("t0ken-ops") == Principal("ops")
    assert keeper.principal("t0ken-op") is None and keeper.principal("") is None


async def test_a_session_is_kept_under_a_digest_and_ends() -> None:
    """Redis holds the session under the id's digest, never the id; closing it ends it."""
    redis = fakeredis.aioredis.FakeRedis()
    sessions = Sessions(redis, 60)
    who = Principal("ops", "ci", Grant(frozenset({"*"}), actions=frozenset({"operate"})))
    session_id, session = await sessions.open(who)
    keys = [key.decode() for key in await redis.keys("*")]
    assert keys == [SESSION_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()]
    assert session_id not in json.dumps([(await redis.get(k)).decode() for k in keys])
    found = await sessions.find(session_id)
    assert found == session and found.principal.grant.may("operate") and session.csrf != session_id
    await sessions.close(session_id)
    assert await sessions.find(session_id) is None and await sessions.find(None) is None


# --- dead letters -----------------------------------------------------------------------------------


def record(calls: list[dict[str, Any]] | None = None, **fields: Any) -> str:
    entry = {"id": fields.pop("id", None), "reason": "unknown task 'x'", "body": None, "bytes": 1, "at": 1.0}
    return json.dumps({**entry, **({"calls": calls} if calls else {}), **fields})


class Enqueued:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail

    async def __call__(self, *call: Any) -> None:
        if self.fail:
            raise ConnectionError("Redis went away")
        self.calls.append(call)


CALL = {"callId": "c-1", "tool": "echo_get", "arguments": {"item": "x"}, "tenant": "ci", "principal": "ops"}


async def test_old_records_get_a_digest_id_and_purge_removes_exactly_one() -> None:
    """A record without an id is named by its digest; purging one of two identical records keeps the other."""
    redis = fakeredis.aioredis.FakeRedis()
    old = json.dumps({"reason": "old", "bytes": 1})
    await redis.lpush(DEAD_LETTER_KEY, old, old, record(id="new-1"))
    letters = DeadLetters(redis)
    ids = [letter.id for letter in await letters.items()]
    assert ids[0] == "new-1" and ids[1] == ids[2] == "sha-" + hashlib.sha256(old.encode()).hexdigest()[:24]
    await letters.purge(ids[1])
    assert [letter.id for letter in await letters.items()] == ids[:2]
    with pytest.raises(NoSuchItem):
        await letters.purge("nope")


async def test_a_replay_enqueues_each_call_once_and_removes_the_item() -> None:
    """Replay enqueues the call with its callId, tenant and principal; a second replay finds nothing."""
    redis = fakeredis.aioredis.FakeRedis()
    await redis.lpush(DEAD_LETTER_KEY, record([CALL], id="d-1"))
    letters, enqueue = DeadLetters(redis), Enqueued()
    assert "c-1" in await letters.replay("d-1", enqueue)
    assert enqueue.calls == [("echo_get", {"item": "x"}, "c-1", "ci", "ops", 60.0)]
    assert await letters.items() == []
    with pytest.raises(NoSuchItem):
        await letters.replay("d-1", enqueue)


async def test_an_answered_call_is_not_replayed() -> None:
    """A call whose callId already has an envelope is refused, and the item stays for an operator."""
    redis = fakeredis.aioredis.FakeRedis()
    await redis.lpush(DEAD_LETTER_KEY, record([CALL], id="d-2"))
    await redis.set(RESULT_KEY_PREFIX + "c-1", "1")
    letters, enqueue = DeadLetters(redis), Enqueued()
    with pytest.raises(NotReplayable, match="already answered"):
        await letters.replay("d-2", enqueue)
    assert enqueue.calls == [] and [letter.id for letter in await letters.items()] == ["d-2"]


async def test_a_failed_replay_can_be_tried_again() -> None:
    """When the enqueue fails, the item stays and a later replay goes through."""
    redis = fakeredis.aioredis.FakeRedis()
    await redis.lpush(DEAD_LETTER_KEY, record([CALL], id="d-3"))
    letters = DeadLetters(redis)
    with pytest.raises(ConnectionError):
        await letters.replay("d-3", Enqueued(fail=True))
    enqueue = Enqueued()
    await letters.replay("d-3", enqueue)
    assert len(enqueue.calls) == 1


async def test_an_item_without_a_call_is_not_replayable() -> None:
    """An item that held no call (or a call without callId) says so; nothing is enqueued."""
    redis = fakeredis.aioredis.FakeRedis()
    await redis.lpush(DEAD_LETTER_KEY, record(id="d-4"), record([{"tool": "x"}], id="d-5"))
    letters = DeadLetters(redis)
    for item in ("d-4", "d-5"):
        with pytest.raises(NotReplayable, match="nothing to replay"):
            await letters.replay(item, Enqueued())


@pytest.mark.parametrize(
    ("body", "tools"),
    [
        ([[{"tool": "a", "callId": "1", "headers": {"X-Secret": "v"}}], {}, {}], ["a"]),
        ([[[{"tool": "a", "callId": "1"}, {"tool": "b", "callId": "2"}]], {}, {}], ["a", "b"]),
        ([[], {}, {}], []),
        ({"tool": "a"}, []),
        ([["not a call"], {}, {}], []),
    ],
)
def test_a_dead_letter_keeps_the_calls_to_replay_without_header_values(body: Any, tools: list[str]) -> None:
    """The calls of a Celery body (one, or a batch) with their header names only."""
    kept = dead_letter.replayable(body)
    assert [call["tool"] for call in kept] == tools
    assert all("headers" not in call for call in kept)


def test_a_dead_letter_record_has_a_stable_id_and_its_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """dead_letter() writes an id and the replayable calls; header values nowhere."""
    server = fakeredis.FakeRedis()
    monkeypatch.setattr(dead_letter, "_redis", lambda: server)
    body = [[{"tool": "a", "callId": "c", "headers": {"X-Secret": "hide-this-value"}}], {}, {}]
    dead_letter.dead_letter("unknown task 'x'", None, json.dumps(body))
    [raw] = server.lrange(DEAD_LETTER_KEY, 0, -1)
    entry = json.loads(raw)
    assert len(entry["id"]) == 32 and entry["calls"] == [{"callId": "c", "tool": "a", "headerNames": ["X-Secret"]}]
    assert b"hide-this-value" not in raw
