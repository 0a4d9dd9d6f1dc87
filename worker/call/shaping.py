"""From the upstream's response to the envelope's fields: transform, decode, redact, truncate."""

from __future__ import annotations

import codecs
import json

import structlog

from worker import errors
from worker.definitions.model import Tool, Upstream
from worker.envelope import ToolResult
from worker.http.transport import PreparedRequest, Response
from worker.redaction import redact

log = structlog.get_logger("toolworker.call")
_READ_MARGIN_BYTES = 64 * 1024


def describe_request(envelope: ToolResult, request: PreparedRequest, upstream: Upstream) -> None:
    """The request as the envelope shows it: secrets redacted, the body cut like the result."""
    envelope.method = request.method
    envelope.url = redact(request.url, request.secrets)
    envelope.headers = request.redacted_headers()
    if request.body is not None:
        text = request.body[: upstream.max_output_chars * 4].decode("utf-8", "replace")
        envelope.body = redact(text, request.secrets)[: upstream.max_output_chars]


def read_limit(tool: Tool, upstream: Upstream) -> int:
    """Bytes worth reading: all of them (to the cap) for a transform, else enough to fill the result."""
    if tool.transform is not None:
        return upstream.max_response_bytes
    chars = tool.max_output_chars or upstream.max_output_chars
    # At most 4 bytes a character, and room for a secret that straddles the cut to be found and redacted.
    return min(upstream.max_response_bytes, 4 * chars + _READ_MARGIN_BYTES)


def shape_result(
    envelope: ToolResult, response: Response, tool: Tool, upstream: Upstream, secrets: frozenset[str]
) -> None:
    """Fill the envelope from the response: transform, decode, redact, truncate."""
    envelope.status_code = response.status
    envelope.content_type = response.content_type
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
    envelope.result = text[:limit]
    envelope.truncated = len(text) > limit or not response.complete
    if not ok:
        envelope.exit_code = 22
        envelope.error = {
            "type": "http_error",
            "message": f"The call failed: the upstream answered HTTP {response.status} {response.reason}. "
            "Its response body is in `result`.",
        }


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
