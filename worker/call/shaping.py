"""From a handler's answer to the envelope: the request described, the response transformed, decoded,
redacted and truncated, or the error."""

from __future__ import annotations

import codecs
import json
from typing import Any

import structlog

from worker import errors
from worker.call.job import Answer, Job
from worker.definitions.model import Tool, Upstream
from worker.envelope import ToolResult
from worker.http.transport import PreparedRequest, Response
from worker.redaction import redact

log = structlog.get_logger("toolworker.call")
_READ_MARGIN_BYTES = 64 * 1024


def envelope(job: Job, answer: Answer) -> ToolResult:
    """The envelope of an admitted call, from its handler's answer: the one place that builds it."""
    request = answer.request
    described = {} if request is None else _described(request, job.upstream)
    secrets = frozenset() if request is None else request.secrets
    try:
        if answer.error is not None:
            raise answer.error
        outcome = {"result": answer.text or ""} if answer.response is None else _shaped(answer.response, job, secrets)
    except errors.ToolError as exc:
        outcome = failed(exc)
    return ToolResult(call_id=job.call.call_id, tool=job.call.tool, attempts=answer.attempts, **described, **outcome)


def failed(error: errors.ToolError) -> dict[str, Any]:
    """The envelope's fields for a call that ended with this error."""
    return {"error": {"type": error.type, "message": error.message}, "exit_code": error.exit_code}


def _described(request: PreparedRequest, upstream: Upstream) -> dict[str, Any]:
    """The request as the envelope shows it: secrets redacted, the body cut like the result."""
    body = None
    if request.body is not None:
        text = request.body[: upstream.max_output_chars * 4].decode("utf-8", "replace")
        body = redact(text, request.secrets)[: upstream.max_output_chars]
    url = redact(request.url, request.secrets)
    return {"method": request.method, "url": url, "headers": request.redacted_headers(), "body": body}


def read_limit(tool: Tool, upstream: Upstream) -> int:
    """Bytes worth reading: all of them (to the cap) for a transform, else enough to fill the result."""
    if tool.transform is not None:
        return upstream.max_response_bytes
    chars = tool.max_output_chars or upstream.max_output_chars
    # At most 4 bytes a character, and room for a secret that straddles the cut to be found and redacted.
    return min(upstream.max_response_bytes, 4 * chars + _READ_MARGIN_BYTES)


def _shaped(response: Response, job: Job, secrets: frozenset[str]) -> dict[str, Any]:
    """The envelope's fields from the response: transform, decode, redact, truncate."""
    tool, upstream = job.tool, job.upstream
    ok = 200 <= response.status < 300
    text = decode(response.body, response.charset)
    if ok and tool.transform is not None:
        if not response.complete:
            raise errors.ResponseTooLarge(
                f"The response is larger than {upstream.max_response_bytes} bytes, "
                "and this tool needs the whole body to extract its result."
            )
        text = _transformed(tool, text)
    limit = tool.max_output_chars or upstream.max_output_chars
    text = redact(text, secrets)
    fields: dict[str, Any] = {
        "status_code": response.status,
        "content_type": response.content_type,
        "result": text[:limit],
        "truncated": len(text) > limit or not response.complete,
    }
    if not ok:
        fields["exit_code"] = 22
        fields["error"] = {
            "type": "http_error",
            "message": f"The call failed: the upstream answered HTTP {response.status} {response.reason}. "
            "Its response body is in `result`.",
        }
    return fields


def decode(body: bytes, charset: str | None) -> str:
    try:
        codec = codecs.lookup(charset or "utf-8").name
    except LookupError:
        codec = "utf-8"
    return body.decode(codec, errors="replace")


def _transformed(tool: Tool, text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        log.warning("call.transform_skipped", reason="response is not JSON")
        return text
    assert tool.transform is not None
    return json.dumps(tool.transform(data), ensure_ascii=False)
