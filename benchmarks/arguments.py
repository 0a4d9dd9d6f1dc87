"""What checking a call's arguments costs: the worker's check (jsonschema-rs, then jsonschema for what it refuses)
against jsonschema alone, on the benchmark's one-argument tool and on a tool of eleven properties such as an
OpenAPI operation has; in this process, CPU time per check.

    python -m benchmarks.arguments
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from worker.call.arguments import ArgumentSchema

CHECKS = 20_000
ROUNDS = 3

ONE = ({"type": "object", "properties": {"i": {"type": "integer"}}}, {"i": 7})
ELEVEN = (
    {
        "type": "object",
        "properties": {
            **{f"text{i}": {"type": "string", "maxLength": 100} for i in range(8)},
            "count": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
            "where": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
        },
        "required": ["text0", "count"],
    },
    {**{f"text{i}": "hello" for i in range(8)}, "count": 3, "tags": ["a", "b"], "where": {"x": 1.5}},
)


def _per_check_us(check: Callable[[], Any]) -> float:
    """The least CPU time of ROUNDS rounds, per check."""
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        for _ in range(CHECKS):
            check()
        best = min(best, time.process_time() - started)
    return best / CHECKS * 1e6


def compare(name: str, schema: dict[str, Any], arguments: dict[str, Any]) -> str:
    ours, alone = ArgumentSchema(schema), Draft202012Validator(schema)
    worker_us = _per_check_us(lambda: ours.check(arguments))
    jsonschema_us = _per_check_us(lambda: list(alone.iter_errors(arguments)))
    return (
        f"{name}: the worker's check {worker_us:.2f} us (nesting and size included), "
        f"jsonschema alone {jsonschema_us:.2f} us ({jsonschema_us / worker_us:.1f}x)"
    )


def main() -> None:
    for name, (schema, arguments) in (("one property", ONE), ("eleven properties", ELEVEN)):
        print(compare(name, schema, arguments))


if __name__ == "__main__":
    main()
