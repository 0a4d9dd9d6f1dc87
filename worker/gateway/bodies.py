"""Reading request bodies at the trust boundary: JSON first, then a pydantic model; clear errors either way."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from worker.constants import MAX_ARGUMENTS_DEPTH

Model = TypeVar("Model", bound=BaseModel)
_MAX_PROBLEMS = 5


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
    try:
        return json.loads(raw)
    except ValueError:
        raise BadBody(400, "The body is not valid JSON.") from None
    except RecursionError:  # nested past what can be read: a call's arguments may nest far less anyway
        raise BadBody(
            400,
            "The body is not valid JSON that can be read: it nests too deep "
            f"(a call's arguments may nest {MAX_ARGUMENTS_DEPTH} levels at most).",
        ) from None


def parse(model: type[Model], data: Any) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [
            {"field": ".".join(map(str, e["loc"])) or "body", "message": e["msg"]} for e in exc.errors()[:_MAX_PROBLEMS]
        ]
        shown = "; ".join(f"`{p['field']}`: {p['message']}" for p in problems)
        raise BadBody(422, f"The body is invalid: {shown}.", problems) from None
