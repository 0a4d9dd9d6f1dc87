"""An MCP server's `tools/call` result as the envelope's fields: `result` the text blocks joined (redacted,
cut like any answer, as JSON when it is JSON), `structuredContent` the server's as it came, `content` the
server's blocks as they came (an image stays an image); `isError` is exit 22 with the text."""

from __future__ import annotations

import json
from typing import Any

from worker import errors
from worker.call import truncation
from worker.call.job import Job
from worker.redaction import redact

# Fields of a content block the SDK adds on its side of the wire, not the server's.
_SDK_ONLY = ("resultType",)


def fields(result: dict[str, Any], job: Job, secrets: frozenset[str]) -> dict[str, Any]:
    """The envelope's fields from the server's result."""
    blocks = [block for block in result.get("content") or [] if isinstance(block, dict)]
    text = redact("\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text"), secrets)
    limit = job.tool.max_output_chars or job.upstream.max_output_chars
    out: dict[str, Any] = {"result": text, "truncated": False}
    if len(text) > limit:
        out.update(_cut(text, limit))
    out.update(_content(blocks, job.upstream.max_response_bytes))
    if result.get("structuredContent") is not None:
        out["structured"] = result["structuredContent"]
    if result.get("isError"):
        error = errors.ToolFailed(f"The tool failed: {out['result'] or 'the MCP server gave no text.'}")
        out.update(exit_code=error.exit_code, error={"type": error.type, "message": error.message})
    return out


def _cut(text: str, limit: int) -> dict[str, Any]:
    """A text over the cap: cut as JSON when it is JSON, else as text."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"result": text[:limit], "truncated": True}
    cut = truncation.fit(parsed, limit)
    return {"result": truncation.dumps(cut.value), "truncated": True, "truncation": cut.note}


def _content(blocks: list[dict[str, Any]], max_bytes: int) -> dict[str, Any]:
    """`content` as it came, unless it is larger than the upstream's max_response_bytes (then left out, said)."""
    size = len(json.dumps(blocks).encode())
    if size > max_bytes:
        return {"note": f"The answer's content blocks ({size} bytes) are over this upstream's cap; the text is kept."}
    return {"content": [{k: v for k, v in block.items() if k not in _SDK_ONLY} for block in blocks]}
