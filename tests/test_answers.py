"""Answers a model can use, through a real worker: JSON cut as JSON, pagination, the cache."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import FIXTURES, SECRET_TOKEN, start_worker, stop_worker, worker_env
from tests.support.answers import ISSUES, ITEMS, USERS, ListState, list_upstream
from tests.support.servers import DnsServer, ServerThread
from tests.support.waiting import wait_until
from worker.call.cache import CACHE_KEY_PREFIX
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@dataclass
class Answers:
    client: ToolClient
    state: ListState
    redis: redis.Redis
    log_path: Path

    def keys(self, tool: str) -> list[str]:
        return sorted(k.decode() for k in self.redis.scan_iter(f"{CACHE_KEY_PREFIX}{tool}:*"))


@pytest.fixture(scope="module")
def answers(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Answers]:
    """A Redis of its own, a worker on tests/fixtures/answers, the list upstream."""
    directory = tmp_path_factory.mktemp("answers")
    server = EmbeddedRedis(directory / "redis").start()
    state = ListState()
    upstream = ServerThread(list_upstream(state)).start()
    env = worker_env(server.url, upstream.url, dns_server.address, FIXTURES / "answers")
    worker = start_worker(env, directory / "worker.log")
    try:
        with ToolClient(server.url) as client:
            warm = client.call("list_items", {}, timeout=60)
            assert warm.exit_code == 0, (warm.to_dict(), (directory / "worker.log").read_text()[-3000:])
            yield Answers(client, state, redis.Redis.from_url(server.url), directory / "worker.log")
    finally:
        stop_worker(worker)
        upstream.stop()
        server.stop()


# --- JSON that stays JSON -----------------------------------------------------------------------------


def test_a_500_item_body_is_cut_to_valid_json(answers: Answers) -> None:
    """A JSON body over max_output_chars stays valid JSON: whole leading items, the note says what was kept."""
    envelope = answers.client.call("many_items", {})
    assert envelope.exit_code == 0 and envelope.truncated is True
    cut = json.loads(envelope.result)
    assert len(envelope.result) <= 2000
    kept = cut["data"]
    assert 10 < len(kept) < 500 and cut["total"] == 500
    assert kept == [{"id": n, "name": f"item {n}", "tags": ["a", "b"]} for n in range(len(kept))]
    assert envelope.truncation == f"kept {len(kept)} of 500 items at $.data"
    assert envelope.structured == cut


def test_structured_value_and_a_body_its_schema_refuses(answers: Answers) -> None:
    """A conforming body is the envelope's structuredContent; one the output schema refuses is text with a note."""
    good = answers.client.call("get_item", {"id": 3})
    assert good.structured == {"id": 3, "name": "item for anyone"} and good.note is None
    wrong = answers.client.call("get_item_wrong", {})
    assert wrong.exit_code == 0 and wrong.structured is None
    assert json.loads(wrong.result) == {"id": "seven", "name": "not an id"}
    assert wrong.note is not None and "output schema" in wrong.note and "$['id']" in wrong.note
    assert wrong.to_dict().get("structuredContent") is None


# --- pagination ---------------------------------------------------------------------------------------


def test_link_pages_up_to_max_pages_then_continue(answers: Answers) -> None:
    """GitHub-style: Link rel=next is followed for 5 pages; next_cursor (the next URL) continues the listing."""
    first = answers.client.call("list_issues", {})
    assert first.exit_code == 0 and first.pages == 5
    assert [i["number"] for i in json.loads(first.result)] == list(range(1, 51))
    assert first.next_cursor is not None and first.next_cursor.endswith("page=6")
    rest = answers.client.call("list_issues", {"cursor": first.next_cursor})
    assert rest.pages == 2 and rest.next_cursor is None
    assert [i["number"] for i in json.loads(rest.result)] == list(range(51, ISSUES + 1))


def test_cursor_pages_up_to_max_pages_then_continue(answers: Answers) -> None:
    """Slack-style: the cursor read from the body goes back as ?cursor=; the listing continues from next_cursor."""
    first = answers.client.call("list_users", {})
    assert first.pages == 5 and first.next_cursor == "c50"
    assert [m["id"] for m in json.loads(first.result)] == [f"U{n:03d}" for n in range(50)]
    rest = answers.client.call("list_users", {"cursor": first.next_cursor})
    assert rest.pages == 3 and rest.next_cursor is None
    assert [m["id"] for m in json.loads(rest.result)] == [f"U{n:03d}" for n in range(50, USERS)]


def test_offset_pages_end_at_a_short_page_and_continue_from_an_offset(answers: Answers) -> None:
    """offset/limit: the offset advances by the limit; a short page is the last; offset= continues."""
    whole = answers.client.call("list_items", {})
    assert whole.pages == 4 and whole.next_cursor is None
    assert [i["n"] for i in json.loads(whole.result)] == list(range(ITEMS))
    rest = answers.client.call("list_items", {"offset": 20})
    assert rest.pages == 2 and [i["n"] for i in json.loads(rest.result)] == list(range(20, ITEMS))


def test_a_next_link_to_another_host_is_refused_and_said(answers: Answers) -> None:
    """A Link to another host is not followed: the page read is returned, with a note naming the host."""
    before = answers.state.hits["/offsite/issues"]
    envelope = answers.client.call("offsite_issues", {})
    assert envelope.exit_code == 0 and envelope.pages == 1 and envelope.next_cursor is None
    assert json.loads(envelope.result) == [{"number": 1}]
    assert envelope.note is not None and "127.0.0.2" in envelope.note and "not followed" in envelope.note
    assert answers.state.hits["/offsite/issues"] == before + 1


def test_a_continuation_to_another_host_is_exit_77(answers: Answers) -> None:
    """A model passing another host's URL as the continuation is refused by the egress policy (exit 77)."""
    envelope = answers.client.call("list_issues", {"cursor": "http://127.0.0.2:9/repos/acme/app/issues?page=2"})
    assert envelope.exit_code == 77 and "another host" in (envelope.error or {})["message"]


# --- caching ------------------------------------------------------------------------------------------


def test_a_hit_is_answered_without_the_upstream(answers: Answers) -> None:
    """The second call of a cached tool is answered from Redis: cached, with its age, no request upstream."""
    before = answers.state.hits["/item"]
    miss = answers.client.call("get_item", {"id": 41})
    hit = answers.client.call("get_item", {"id": 41})
    assert miss.cached is False and hit.cached is True and hit.age is not None and hit.age >= 0
    assert hit.result == miss.result and hit.structured == {"id": 41, "name": "item for anyone"}
    assert hit.call_id != miss.call_id
    assert answers.state.hits["/item"] == before + 1
    other = answers.client.call("get_item", {"id": 42})  # other arguments: another request, another key
    assert other.cached is False and answers.state.hits["/item"] == before + 2


def test_per_user_credentials_are_never_shared(answers: Answers) -> None:
    """Calls with another user's per-call credential miss; each user's own answer is cached for that user."""
    before = answers.state.hits["/item"]
    alice = answers.client.call("get_item", {"id": 5}, headers={"X-User-Token": "alice-token"})
    assert alice.cached is False
    bob = answers.client.call("get_item", {"id": 5}, headers={"X-User-Token": "bob-token"})
    alice_again = answers.client.call("get_item", {"id": 5}, headers={"X-User-Token": "alice-token"})
    assert bob.cached is False and json.loads(bob.result)["name"] == "item for bob"
    assert alice_again.cached is True and json.loads(alice_again.result)["name"] == "item for alice"
    assert answers.state.hits["/item"] == before + 2
    keys = answers.keys("get_item")
    stored = b"".join([*(answers.redis.get(k) or b"" for k in keys), *(k.encode() for k in keys)])
    for secret in ("alice-token", "bob-token", SECRET_TOKEN):  # no credential in clear, in a key or a value
        assert secret.encode() not in stored


def test_no_store_and_private_are_respected(answers: Answers) -> None:
    """Cache-Control no-store and private keep an answer out of the cache."""
    for tool, path in (("get_item_nostore", "/item-nostore"), ("get_item_private", "/item-private")):
        before = answers.state.hits[path]
        first, second = answers.client.call(tool, {}), answers.client.call(tool, {})
        assert first.cached is False and second.cached is False
        assert answers.state.hits[path] == before + 2 and answers.keys(tool) == []


def test_a_shorter_max_age_wins_and_an_answer_expires(answers: Answers) -> None:
    """max-age=1 under ttl_seconds 30: kept about a second; once expired the next call goes upstream."""
    before = answers.state.hits["/item-brief"]
    answers.client.call("get_item_brief", {})
    (key,) = answers.keys("get_item_brief")
    assert 0 < answers.redis.pttl(key) <= 1000
    assert answers.client.call("get_item_brief", {}).cached is True or answers.redis.exists(key) == 0
    wait_until(lambda: answers.redis.exists(key) == 0, 10, "the cached answer to expire")
    assert answers.client.call("get_item_brief", {}).cached is False
    assert answers.state.hits["/item-brief"] >= before + 2


def test_post_is_never_cached_on_a_cached_upstream(answers: Answers) -> None:
    """An upstream's cache applies to its GET tools; a POST is sent every time."""
    before_post = answers.state.hits["/item"]
    posts = [answers.client.call("create_item", {"name": "x"}) for _ in range(2)]
    assert [p.cached for p in posts] == [False, False] and answers.keys("create_item") == []
    reads = [answers.client.call("read_item", {"id": 9}) for _ in range(2)]
    assert [r.cached for r in reads] == [False, True]
    assert answers.state.hits["/item"] == before_post + 3
