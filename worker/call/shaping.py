"""From a handler's answer to the envelope: the request described, the response transformed, decoded,
redacted and truncated, or the error."""

from __future__ import annotations

import codecs
import json
from typing import Any

import structlog

from worker import errors
from worker.call import mcp_answer, structured, truncation
from worker.call.job import Answer, Job
from worker.definitions.model import Tool, Upstream
from worker.envelope import ToolResult
from worker.http.transport import PreparedRequest, Response
from worker.redaction import redact

log = structlog.get_logger("toolworker.call")
_READ_MARGIN_BYTES = 64 * 1024
# A JSON body is read whole up to this (or max_response_bytes) so that it can be cut as JSON, not as text.
JSON_WHOLE_READ_BYTES = 1024 * 1024


def envelope(job: Job, answer: Answer) -> ToolResult:
    """The envelope of an admitted call, from its handler's answer: the one place that builds it."""
    request = answer.request
    described = {} if request is None else _described(request, job.upstream)
    secrets = frozenset() if request is None else request.secrets
    outcome: dict[str, Any]
    try:
        if answer.error is not None:
            raise answer.error
        if answer.mcp is not None:
            outcome = mcp_answer.fields(answer.mcp, job, secrets)
        elif answer.response is None:
            outcome = {"result": answer.text or ""}
        else:
            outcome = _shaped(answer.response, job, secrets)
    except errors.ToolError as exc:
        outcome = failed(exc)
    outcome.update(pages=answer.pages, next_cursor=answer.next_cursor)
    if answer.note is not None:
        outcome["note"] = " ".join(filter(None, (outcome.get("note"), answer.note)))
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
    # At most 4 bytes a character, and room for a secret that straddles the cut to be found and redacted;
    # a JSON body whole, to be cut as JSON.
    return min(upstream.max_response_bytes, max(4 * chars + _READ_MARGIN_BYTES, JSON_WHOLE_READ_BYTES))


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
    fields: dict[str, Any] = {"status_code": response.status, "content_type": response.content_type}
    parsed = _json_body(text, response) if ok else _NOT_JSON
    if parsed is _NOT_JSON:
        fields.update(result=text[:limit], truncated=len(text) > limit or not response.complete)
    else:
        fields.update(_json_fields(text, parsed, limit, tool))
    if not ok:
        fields["exit_code"] = 22
        # Read on every surface (an envelope's `error`, an MCP tool result's text): it names no field.
        body = "." if text else ", with an empty body."
        fields["error"] = {
            "type": "http_error",
            "message": f"The call failed: the upstream answered HTTP {response.status} {response.reason}{body}",
        }
    return fields


_NOT_JSON = object()


def _json_body(text: str, response: Response) -> Any:
    """The body parsed, when it is JSON that arrived whole; else _NOT_JSON (it is then cut as text)."""
    if not response.complete or not text or text.lstrip()[:1] not in _JSON_STARTS:
        return _NOT_JSON
    try:
        return json.loads(text, parse_constant=_not_json_constant)
    except ValueError:
        return _NOT_JSON


def _not_json_constant(name: str) -> Any:
    """NaN, Infinity and -Infinity, which Python reads and JSON has no word for: such a body is text."""
    raise ValueError(f"{name} is not JSON")


# What a JSON document that is worth reading as structure starts with (an object, an array, a string).
_JSON_STARTS = frozenset('{["')


def _json_fields(text: str, parsed: Any, limit: int, tool: Tool) -> dict[str, Any]:
    """`result` (cut as JSON past `limit`), the parsed value, and what was cut or does not conform."""
    fields: dict[str, Any] = {"result": text, "truncated": False}
    if len(text) > limit:
        cut = truncation.fit(parsed, limit)
        parsed = cut.value
        fields.update(result=truncation.dumps(parsed), truncated=True, truncation=cut.note)
    mismatch = structured.mismatch(tool, parsed)
    if mismatch is None:
        fields["structured"] = parsed
    else:
        fields["note"] = f"The answer does not match this tool's output schema ({mismatch}); it is given as text."
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
