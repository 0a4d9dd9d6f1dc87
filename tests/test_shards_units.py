"""Shards without servers: the list's syntax, placement by rendezvous hashing, the settings' rules, and
approvals over shards (fakeredis, one of them down)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any, cast

import fakeredis
import pytest
import redis
from pydantic import ValidationError

from worker.cli import main
from worker.constants import RESULT_KEY_PREFIX
from worker.gateway.decisions import Decisions
from worker.gateway.identity.principals import Grant, Principal
from worker.queue.approvals import APPROVALS_KEY, NotParked, approval_key
from worker.queue.publisher import Publisher
from worker.settings import Settings, get_settings
from worker.shards import Shards

FakeRedis = fakeredis.aioredis.FakeRedis

THREE = (
    "s1=redis://127.0.0.1:7001/0 s2=redis://127.0.0.1:7002/0,s3=sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380/2"
)
FOUR = THREE + " s4=redis://127.0.0.1:7004/0"
TENANTS = [f"tenant-{i}" for i in range(60)]


def test_the_list_takes_spaces_and_commas_and_keeps_its_order() -> None:
    shards = Shards.parse(THREE)
    assert [shard.name for shard in shards.all] == ["s1", "s2", "s3"]
    assert shards.home.name == "s1" and shards.sharded
    assert shards.named("s3").where == "shard s3 (127.0.0.1:26379,127.0.0.1:26380)"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no shard"),
        ("s1", "is not name=url"),
        ("=redis://h:1/0", "is not name=url"),
        ("s 1=redis://h:1/0", "is not name=url"),
        ("s1=http://h:1/0", "is not a URL of"),
        ("s1=redis://h:1/0 s1=redis://h:2/0", "named twice"),
    ],
)
def test_a_malformed_list_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Shards.parse(text)


def test_a_password_never_appears_in_what_names_a_shard() -> None:
    shards = Shards.parse("s1=redis://:hunter22@127.0.0.1:7001/0")
    assert "hunter22" not in shards.home.where
    with pytest.raises(ValueError) as refused:
        Shards.parse("s1=http://:hunter22@127.0.0.1:7001/0")
    assert "hunter22" not in str(refused.value)


def test_sixty_tenants_spread_over_three_shards() -> None:
    placed = Counter(Shards.parse(THREE).of(tenant).name for tenant in TENANTS)
    assert set(placed) == {"s1", "s2", "s3"}
    assert all(10 <= count <= 30 for count in placed.values()), placed


def test_placement_does_not_depend_on_the_order_of_the_list() -> None:
    reordered = " ".join(reversed(THREE.replace(",", " ").split()))
    one, other = Shards.parse(THREE), Shards.parse(reordered)
    assert all(one.of(tenant).name == other.of(tenant).name for tenant in TENANTS)


def test_a_shard_added_takes_about_a_quarter_of_the_tenants_and_only_to_itself() -> None:
    before, after = Shards.parse(THREE), Shards.parse(FOUR)
    moved = [tenant for tenant in TENANTS if before.of(tenant).name != after.of(tenant).name]
    assert all(after.of(tenant).name == "s4" for tenant in moved)
    assert 5 <= len(moved) <= 25, len(moved)  # 15 expected


@pytest.mark.integration
def test_every_process_places_tenants_alike() -> None:
    """Not Python's hash(): another interpreter, with another hash seed, places every tenant the same."""
    script = (
        "import json, sys; from worker.shards import Shards;"
        f"s = Shards.parse({THREE!r}); print(json.dumps({{t: s.of(t).name for t in {TENANTS!r}}}))"
    )
    placements = []
    for seed in ("1", "2"):
        env = os.environ | {"PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        placements.append(json.loads(out.stdout))
    here = Shards.parse(THREE)
    assert placements[0] == placements[1] == {tenant: here.of(tenant).name for tenant in TENANTS}


def test_with_shards_the_redis_url_is_ignored_and_the_home_shard_takes_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLWORKER_REDIS_URL", "redis://nowhere.invalid:1/0")
    monkeypatch.setenv("TOOLWORKER_REDIS_SHARDS", THREE)
    monkeypatch.setenv("TOOLWORKER_SHARD", "s2")
    settings = Settings()
    assert settings.redis_url == "redis://127.0.0.1:7001/0"
    assert settings.queue_url == "redis://127.0.0.1:7002/0"


def test_without_shards_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLWORKER_REDIS_URL", "redis://127.0.0.1:7009/3")
    settings = get_settings()
    assert settings.queue_url == settings.redis_url == "redis://127.0.0.1:7009/3"
    assert not settings.shards.sharded and settings.shards.of("anyone").url == settings.redis_url


def test_a_process_given_a_shard_the_list_does_not_have_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLWORKER_REDIS_SHARDS", THREE)
    monkeypatch.setenv("TOOLWORKER_SHARD", "s9")
    with pytest.raises(ValidationError, match="no shard named 's9'"):
        Settings()


def parked_on(client: Any, call_id: str) -> Awaitable[Any]:
    """A call parked for approval, as a worker's gate records it (the hash and the index)."""
    expires = time.time() + 60
    fields = {"state": "parked", "tool": "delete_item", "tenant": "acme", "expires": repr(expires)}
    fields["call"] = json.dumps({"callId": call_id, "tool": "delete_item", "arguments": {"item": "x"}})
    pipe = client.pipeline()
    pipe.hset(approval_key(call_id), mapping=fields)
    pipe.zadd(APPROVALS_KEY, {call_id: expires})
    return cast(Awaitable[Any], pipe.execute())


async def test_approvals_are_listed_and_decided_on_the_shard_that_holds_them_even_with_one_shard_down() -> None:
    """A shard that does not answer leaves the listing and the decision to the others."""
    down, home, other = (fakeredis.aioredis.FakeRedis(connected=False), FakeRedis(), FakeRedis())
    await parked_on(other, "call-on-other")
    decisions = Decisions([home, down, other], lambda client: Publisher(client, 60, 100), None)
    listed = await decisions.parked()
    assert [row["callId"] for row in listed] == ["call-on-other"]
    everyone = Principal("ops", grant=Grant(actions=frozenset({"approve"})))
    done = await decisions.decide(everyone, "call-on-other", "deny", "no")
    assert done["decision"] == "deny"
    assert await other.exists(RESULT_KEY_PREFIX + "call-on-other") == 1  # the denial's envelope, on its shard
    assert await home.exists(RESULT_KEY_PREFIX + "call-on-other") == 0
    with pytest.raises(NotParked):
        await decisions.decide(everyone, "nowhere", "approve", "")


async def test_with_every_shard_down_the_listing_says_so() -> None:
    decisions = Decisions([fakeredis.aioredis.FakeRedis(connected=False)] * 2, lambda c: Publisher(c, 60, 100), None)
    with pytest.raises(redis.exceptions.ConnectionError):
        await decisions.parked()


def test_the_command_line_refuses_a_malformed_list_in_one_line_with_exit_78(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A setting the settings refuse: exit 78 (EX_CONFIG) and the reason, no traceback, no value quoted."""
    monkeypatch.setenv("TOOLWORKER_REDIS_SHARDS", "s1=redis://:hunter22@127.0.0.1:7001/0 s1=redis://127.0.0.1:7002/0")
    assert main(["shards"]) == 78
    assert capsys.readouterr().err == "toolworker: invalid setting: shard s1 is named twice\n"
    monkeypatch.setenv("TOOLWORKER_REDIS_SHARDS", THREE)
    monkeypatch.setenv("TOOLWORKER_CONCURRENCY", "many")
    get_settings.cache_clear()
    assert main(["shards", "--tenant", "acme"]) == 78
    assert capsys.readouterr().err.startswith("toolworker: invalid setting: TOOLWORKER_CONCURRENCY: ")
