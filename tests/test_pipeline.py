"""End to end: ToolClient → real Redis-compatible server → real `toolworker worker` process → real upstream."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from tests.conftest import FIXTURES, SECRET_TOKEN, Upstream, WorkerProcess, start_worker, stop_worker, worker_env
from tests.support.servers import DnsServer
from worker.client import ToolClient
from worker.constants import DEFAULT_QUEUE, RESULT_KEY_PREFIX, TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.dev.embedded import EmbeddedRedis
from worker.protocol import envelope_from_meta, task_message

pytestmark = pytest.mark.integration


def test_2xx_json_envelope(client: ToolClient) -> None:
    """A 2xx JSON answer is exit 0 with status, content type, URL and the body as result."""
    result = client.call("echo_get", {"item": "TICKET-123", "tags": ["a", "b"]})
    assert result.exit_code == 0 and result.error is None
    assert result.status_code == 200
    assert result.content_type is not None and result.content_type.startswith("application/json")
    assert result.url is not None and result.url.endswith("/echo/items/TICKET-123?tag=a&tag=b")
    echoed = json.loads(result.result)
    assert echoed["path"] == "/echo/items/TICKET-123"
    assert echoed["query"] == [["tag", "a"], ["tag", "b"]]
    assert result.attempts == 1 and result.duration_ms > 0


def test_path_argument_cannot_traverse(client: ToolClient) -> None:
    """A path argument is one percent-encoded segment: `../admin?x=1` stays inside it."""
    result = client.call("echo_get", {"item": "../admin?x=1"})
    assert json.loads(result.result)["path"] == "/echo/items/..%2Fadmin%3Fx%3D1"


def test_structured_body_keeps_types(client: ToolClient, upstream: Upstream) -> None:
    """POST sends the structured body with typed leaves; an absent optional leaf is dropped."""
    result = client.call("echo_post", {"title": 'say "hi"', "count": 3, "note": "extra"})
    echoed = json.loads(result.result)
    assert echoed["method"] == "POST"
    assert json.loads(echoed["body"]) == {"note": "extra", "title": 'say "hi"', "count": 3, "meta": {"kind": "test"}}
    assert echoed["headers"]["Content-Type"] == "application/json"
    assert json.loads(result.body or "") == json.loads(echoed["body"])


def test_non_2xx_keeps_status_and_body(client: ToolClient) -> None:
    """A non-2xx answer is exit 22 with its status code and body kept, and a message for the model."""
    result = client.call("status", {"code": 503})
    assert result.exit_code == 22
    assert result.status_code == 503
    assert result.result == "upstream says 503"
    assert result.error is not None and "503" in result.error["message"]


def test_timeout(client: ToolClient) -> None:
    """An upstream slower than the tool's timeout is exit 28, and the worker gives up on time."""
    result = client.call("slow", {"delay": 5})
    assert result.exit_code == 28
    assert result.error is not None and result.error["type"] == "timeout"
    assert 1400 <= result.duration_ms < 4000


def test_connection_refused(client: ToolClient) -> None:
    """Nothing listening is exit 7."""
    result = client.call("refused", {})
    assert result.exit_code == 7, result.to_dict()


def test_unknown_host(client: ToolClient) -> None:
    """A host that does not resolve is exit 6 (resolved through a local NXDOMAIN server)."""
    result = client.call("unresolvable", {})
    assert result.exit_code == 6, result.to_dict()
    assert result.error is not None and "unknown-host.test" in result.error["message"]


def test_unknown_tool(client: ToolClient) -> None:
    """A tool that no definition names is exit 64."""
    result = client.call("no_such_tool", {})
    assert result.exit_code == 64
    assert result.error is not None and "no_such_tool" in result.error["message"]


def test_invalid_arguments(client: ToolClient, upstream: Upstream) -> None:
    """Arguments that break the schema are exit 65 with a message a model can act on; nothing is sent."""
    before = len(upstream.state.hits)
    result = client.call("echo_get", {"limit": "ten"})
    assert result.exit_code == 65
    assert result.error is not None
    assert "`item` is required" in result.error["message"]
    assert "`limit`" in result.error["message"] and "integer" in result.error["message"]
    assert len(upstream.state.hits) == before


def test_huge_body_is_truncated_without_reading_it_all(client: ToolClient, upstream: Upstream) -> None:
    """A 50 MB body stops at max_response_bytes (1 MiB): truncated result, the stream is abandoned."""
    upstream.state.streamed_bytes = 0
    result = client.call("huge", {"mb": 50})
    assert result.exit_code == 0
    assert result.truncated is True
    assert len(result.result) == 2000
    # The upstream could push only what the socket buffers held before the worker hung up.
    assert upstream.state.streamed_bytes < 20 * 1024 * 1024


def test_redirect_loop(client: ToolClient) -> None:
    """A redirect loop stops after 5 hops with exit 47."""
    result = client.call("redirect_loop", {})
    assert result.exit_code == 47


def test_gzip_body(client: ToolClient) -> None:
    """A gzip-encoded body is decompressed before the transform applies."""
    result = client.call("gzipped", {})
    assert result.exit_code == 0
    assert result.result == "true"


def test_non_utf8_charset(client: ToolClient) -> None:
    """A body is decoded by its declared charset."""
    result = client.call("latin1", {})
    assert result.result == "café crème"


def test_secrets_redacted_in_envelope_and_logs(client: ToolClient, worker: WorkerProcess) -> None:
    """Env-derived and call-header secrets reach the upstream but never the envelope or the logs."""
    user_token = f"user-token-{uuid.uuid4().hex}"
    result = client.call("echo_get", {"item": "x"}, headers={"X-User-Token": user_token})
    assert result.exit_code == 0
    assert result.headers["Authorization"] == "[redacted]"
    assert result.headers["X-User-Token"] == "[redacted]"
    envelope_text = json.dumps(result.to_dict())
    assert SECRET_TOKEN not in envelope_text and user_token not in envelope_text
    # The upstream did receive them: its echo, redacted in the result, shows where they were.
    echoed = json.loads(result.result)["headers"]
    assert echoed["Authorization"] == "[redacted]"  # the whole header value is a recorded secret
    assert echoed["X-User-Token"] == "[redacted]"
    log_text = worker.log_text()
    assert result.call_id in log_text
    assert SECRET_TOKEN not in log_text and user_token not in log_text


def test_call_header_not_allowed_is_dropped(client: ToolClient) -> None:
    """A call header the upstream does not list as overridable is not sent."""
    result = client.call("echo_get", {"item": "x"}, headers={"X-Other": "value"})
    assert "X-Other" not in json.loads(result.result)["headers"]


def test_reply_stream_and_plain_redis_enqueue(worker: WorkerProcess) -> None:
    """A call LPUSHed with plain Redis commands is answered on its replyTo stream and under its callId."""
    r = redis.Redis.from_url(worker.redis_url)
    call_id, stream = str(uuid.uuid4()), f"test:replies:{uuid.uuid4().hex}"
    call = {"callId": call_id, "tool": "echo_get", "arguments": {"item": "streamed"}, "replyTo": stream}
    r.lpush(DEFAULT_QUEUE, task_message(call_id, [call], DEFAULT_QUEUE, TASK_EXECUTE))
    entries = r.xread({stream: "0-0"}, block=30_000, count=1)
    assert entries, "no envelope on the reply stream"
    envelope = json.loads(entries[0][1][0][1][b"envelope"])
    assert envelope["callId"] == call_id and envelope["exitCode"] == 0
    stored = envelope_from_meta(r.get(RESULT_KEY_PREFIX + call_id) or b"{}")
    assert stored == envelope


def test_expired_deadline_is_not_sent(client: ToolClient, worker: WorkerProcess, upstream: Upstream) -> None:
    """A call whose deadline passed before pickup is exit 75 and the upstream never sees it."""
    r = redis.Redis.from_url(worker.redis_url)
    call_id, stream = str(uuid.uuid4()), f"test:replies:{uuid.uuid4().hex}"
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    marker = f"expired-{uuid.uuid4().hex}"
    call = {"callId": call_id, "tool": "echo_get", "arguments": {"item": marker}, "deadline": past, "replyTo": stream}
    r.lpush(DEFAULT_QUEUE, task_message(call_id, [call], DEFAULT_QUEUE, TASK_EXECUTE))
    entries = r.xread({stream: "0-0"}, block=30_000, count=1)
    envelope = json.loads(entries[0][1][0][1][b"envelope"])
    assert envelope["exitCode"] == 75
    assert not any(marker in path for _, path in upstream.state.hits)


def test_malformed_messages_get_envelopes(worker: WorkerProcess) -> None:
    """A message that is not a call object still gets exactly one envelope (65) under its task id."""
    r = redis.Redis.from_url(worker.redis_url)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for task_id, payload in zip(ids, ["not an object", {"arguments": {}}, {"tool": 42}], strict=True):
        r.lpush(DEFAULT_QUEUE, task_message(task_id, [payload], DEFAULT_QUEUE, TASK_EXECUTE))
    with ToolClient(worker.redis_url) as tool_client:
        results = [tool_client._run(tool_client._async.result(task_id, 30), 30) for task_id in ids]
    assert [res.exit_code for res in results] == [65, 65, 65]
    assert all(res.call_id == task_id for res, task_id in zip(results, ids, strict=True))


def test_an_invalid_call_is_answered_on_its_reply_stream(worker: WorkerProcess) -> None:
    """A call that fails validation (arguments not an object) gets its 65 envelope on its replyTo stream too."""
    r = redis.Redis.from_url(worker.redis_url)
    call_id, stream = str(uuid.uuid4()), f"test:replies:{uuid.uuid4().hex}"
    call = {"callId": call_id, "tool": "echo_get", "arguments": "not an object", "replyTo": stream}
    r.lpush(DEFAULT_QUEUE, task_message(call_id, [call], DEFAULT_QUEUE, TASK_EXECUTE))
    entries = r.xread({stream: "0-0"}, block=30_000, count=1)
    assert entries, "no envelope on the reply stream"
    envelope = json.loads(entries[0][1][0][1][b"envelope"])
    assert envelope["callId"] == call_id and envelope["exitCode"] == 65
    assert "arguments" in envelope["error"]["message"]


def test_batch_message(client: ToolClient) -> None:
    """call_many sends one batch message; each call gets its own envelope, in order."""
    results = client.call_many([("echo_get", {"item": f"b{i}"}) for i in range(5)] + [("status", {"code": 404})])
    assert [r.exit_code for r in results] == [0] * 5 + [22]
    assert [json.loads(r.result)["path"] for r in results[:5]] == [f"/echo/items/b{i}" for i in range(5)]
    assert len({r.call_id for r in results}) == 6


def test_batch_of_raw_messages_with_bad_entries(worker: WorkerProcess) -> None:
    """In a batch, an invalid entry gets its own envelope and the others run."""
    r = redis.Redis.from_url(worker.redis_url)
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    batch = [{"callId": good, "tool": "echo_get", "arguments": {"item": "ok"}}, {"callId": bad, "tool": ["x"]}]
    r.lpush(DEFAULT_QUEUE, task_message(str(uuid.uuid4()), [batch], DEFAULT_QUEUE, TASK_EXECUTE_BATCH))
    with ToolClient(worker.redis_url) as tool_client:
        results = {cid: tool_client._run(tool_client._async.result(cid, 30), 30) for cid in (good, bad)}
    assert results[good].exit_code == 0
    assert results[bad].exit_code == 65


def test_submit_handle(client: ToolClient) -> None:
    """submit() returns a handle whose get() waits for the envelope."""
    handle = client.submit("echo_get", {"item": "later"})
    assert handle.get(timeout=30).call_id == handle.call_id


def test_submit_then_close_still_enqueues(worker: WorkerProcess) -> None:
    """Calls submitted just before the client closes are still enqueued and answered."""
    with ToolClient(worker.redis_url) as submitter:
        handles = [submitter.submit("echo_get", {"item": f"last-{i}"}) for i in range(5)]
    with ToolClient(worker.redis_url) as reader:
        results = [reader._run(reader._async.result(h.call_id, 30), 30) for h in handles]
    assert [r.exit_code for r in results] == [0] * 5


@pytest.mark.timeout(90)
def test_secrets_stay_out_of_debug_logs(tmp_path: Path, upstream: Upstream, dns_server: DnsServer) -> None:
    """At debug level too (Celery's and kombu's own loggers included), call-header values stay out of the log."""
    redis = EmbeddedRedis(tmp_path / "redis").start()
    env = worker_env(redis.url, upstream.url, dns_server.address, FIXTURES / "integration")
    env["TOOLWORKER_LOG_LEVEL"] = "DEBUG"
    log = tmp_path / "worker.log"
    process = start_worker(env, log, "--loglevel", "DEBUG")
    user_token = f"user-token-{uuid.uuid4().hex}"
    try:
        with ToolClient(redis.url) as debug_client:
            result = debug_client.call("echo_get", {"item": "x"}, headers={"X-User-Token": user_token}, timeout=60)
    finally:
        stop_worker(process)
        redis.stop()
    assert result.exit_code == 0
    log_text = log.read_text(errors="replace")
    assert result.call_id in log_text
    assert SECRET_TOKEN not in log_text and user_token not in log_text


def test_calls_near_the_arguments_cap_submitted_together_are_each_answered(client: ToolClient) -> None:
    """Twelve calls of 800 KB each, sent in one go, exceed the workers' 8 MiB message limit together: they
    leave in several batch messages, and every call gets its own envelope."""
    calls = [("echo_post", {"title": f"big-{i}", "note": f"big-{i}:" + "n" * 800_000}) for i in range(12)]
    results = client.call_many(calls, timeout=60)
    assert [r.exit_code for r in results] == [0] * 12
    assert all((r.body or "").startswith(f'{{"note":"big-{i}:') for i, r in enumerate(results))
