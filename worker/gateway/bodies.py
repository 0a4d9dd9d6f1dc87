"""Reading request bodies at the trust boundary: JSON first, then a pydantic model; clear errors either way."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

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
    except (ValueError, RecursionError):
        raise BadBody(400, "The body is not valid JSON.") from None


def parse(model: type[Model], data: Any) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [
            {"field": ".".join(map(str, e["loc"])) or "body", "message": e["msg"]} for e in exc.errors()[:_MAX_PROBLEMS]
        ]
        shown = "; ".join(f"`{p['field']}`: {p['message']}" for p in problems)
        raise BadBody(422, f"The body is invalid: {shown}.", problems) from None
