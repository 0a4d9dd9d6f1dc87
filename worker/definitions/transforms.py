"""Response transforms: JMESPath expressions, compiled at load time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jmespath
import jmespath.exceptions
from jmespath.parser import ParsedResult


class TransformError(ValueError):
    """A transform spec is invalid (reported at load time)."""


@dataclass(frozen=True, slots=True)
class JMESPath:
    expression: ParsedResult

    def __call__(self, data: Any) -> Any:
        return self.expression.search(data)


def jmespath_transform(expression: str) -> JMESPath:
    try:
        return JMESPath(jmespath.compile(expression))
    except jmespath.exceptions.JMESPathError as exc:
        raise TransformError(f"invalid JMESPath expression {expression!r}: {exc}") from exc
