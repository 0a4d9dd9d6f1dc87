"""Reading request bodies at the trust boundary: JSON first, then a pydantic model; clear errors either way."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from worker.constants import MAX_ARGUMENTS_DEPTH

Model = TypeVar("Model", bound=BaseModel)
_MAX_PROBLEMS = 5
# A \uD800-\uDFFF escape: JSON's grammar lets one stand alone, but it is no Unicode text (it cannot be
# encoded, so it would fail wherever the call goes next). Seen, the decoded body is checked for a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class BadBody(ValueError):
    """A body that is not what the route takes; `status` 400 (not JSON) or 422 (wrong shape)."""

    def __init__(self, status: int, message: str, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = problems or []


async def json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    return loads(raw)


def loads(raw: bytes, what: str = "The body") -> Any:
    """JSON as RFC 8259 has it, and Unicode text throughout; BadBody (400) naming what is wrong otherwise."""
    try:
        data = json.loads(raw, parse_constant=_not_json)
    except ValueError:
        raise BadBody(400, f"{what} is not valid JSON.") from None
    except RecursionError:  # nested past what can be read: a call's arguments may nest far less anyway
        raise BadBody(
            400,
            f"{what} is not valid JSON that can be read: it nests too deep "
            f"(a call's arguments may nest {MAX_ARGUMENTS_DEPTH} levels at most).",
        ) from None
    if _SURROGATE_ESCAPE.search(raw) and not _unicode(data):
        raise BadBody(400, f"{what} holds a lone surrogate escape (\\ud800-\\udfff), which is not Unicode text.")
    return data


def _not_json(constant: str) -> Any:
    """NaN, Infinity and -Infinity: Python reads them, JSON has no such values."""
    raise ValueError(f"{constant} is not JSON")


def _unicode(data: Any) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


def parse(model: type[Model], data: Any, what: str = "The body") -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = problems_of(exc)
        shown = "; ".join(f"`{p['field']}`: {p['message']}" for p in problems)
        raise BadBody(422, f"{what} is invalid: {shown}.", problems) from None


def problems_of(exc: ValidationError, whole: str = "body") -> list[dict[str, Any]]:
    """pydantic's errors as the API lists them (five at most), each with its field; `whole` names the value
    itself."""
    return [{"field": ".".join(map(str, e["loc"])) or whole, "message": e["msg"]} for e in exc.errors()[:_MAX_PROBLEMS]]
