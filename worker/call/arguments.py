"""A call's arguments checked before it runs: their nesting, their size, and its tool's input schema.

Each tool's schema is compiled once by each of two validators. jsonschema-rs (Rust) says in a fraction of a
microsecond whether arguments conform, and a call whose arguments do goes on; jsonschema says what is wrong
with those that jsonschema-rs refuses, in the words the model reads, and serves alone a schema jsonschema-rs
does not compile. Both read JSON Schema 2020-12; where they read an edge case differently (jsonschema-rs takes
a `pattern` as the ECMA-262 regex the specification names, so `$` does not match before a final newline and
`\\p{L}` is a class of letters; its `multipleOf` is exact for decimals, 0.07 being a multiple of 0.01),
arguments that either accepts are accepted. Neither fetches a remote `$ref`: a tool whose schema needs one
cannot be used (78).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaViolation
from referencing import Registry
from referencing.exceptions import Unresolvable

from worker import errors, json_text
from worker.constants import MAX_ARGUMENTS_BYTES, MAX_ARGUMENTS_DEPTH

_MAX_REPORTED_ERRORS = 5


class ArgumentSchema:
    """A tool's input schema, compiled once."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        # An empty registry: jsonschema would fetch a remote $ref itself otherwise (urllib, on the event loop).
        self._judge = Draft202012Validator(schema, registry=Registry())
        try:
            self._quick: jsonschema_rs.Draft202012Validator | None = jsonschema_rs.Draft202012Validator(
                _plain(schema), offline=True
            )
        except (ValueError, RecursionError):  # a schema jsonschema-rs does not compile (a remote $ref): the judge's
            self._quick = None

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments, if they nest no deeper than MAX_ARGUMENTS_DEPTH, fit MAX_ARGUMENTS_BYTES and conform;
        else InvalidArguments, saying what is wrong for the model to read."""
        check_nesting(arguments)  # first: what follows walks the arguments recursively (jsonschema-rs in Rust)
        size = encoded_size(arguments)
        if size > MAX_ARGUMENTS_BYTES:
            raise errors.InvalidArguments(f"The arguments are too large ({size} bytes; at most {MAX_ARGUMENTS_BYTES}).")
        problems = self._problems(arguments)
        if problems:
            shown = problems[:_MAX_REPORTED_ERRORS]
            more = f" (and {len(problems) - len(shown)} more)" if len(problems) > len(shown) else ""
            raise errors.InvalidArguments("Invalid arguments: " + "; ".join(shown) + more + ".")
        return arguments

    def _problems(self, arguments: dict[str, Any]) -> list[str]:
        if self._quick is not None:
            try:
                if self._quick.is_valid(arguments):
                    return []
            except (ValueError, TypeError, OverflowError):  # values Rust's JSON cannot hold (a lone surrogate, NaN)
                pass
        try:
            errors_found = sorted(self._judge.iter_errors(arguments), key=lambda e: list(e.path))
        except Unresolvable as exc:
            raise errors.ToolMisconfigured(
                f"This tool cannot be used: its input schema refers to {str(exc.ref)[:200]!r}, which is not in it. "
                "Tell the operator."
            ) from None
        return [_explain(e) for e in errors_found]


def _plain(value: Any) -> Any:
    """The schema as dicts and lists (jsonschema-rs takes no other mapping or sequence)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def encoded_size(value: Any) -> int:
    """UTF-8 size of a JSON value; text that is not valid Unicode (a lone surrogate) is refused."""
    try:
        return len(json_text.utf8(value))
    except UnicodeEncodeError:
        raise errors.InvalidArguments("The arguments or headers contain text that is not valid Unicode.") from None


def check_nesting(arguments: Any) -> None:
    """Refuse arguments that nest objects and arrays deeper than MAX_ARGUMENTS_DEPTH (the arguments object
    itself is level 1). Walked without recursion, so that no depth can exhaust the stack here."""
    pending: list[tuple[Any, int]] = [(arguments, 1)]
    while pending:
        value, depth = pending.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else None
        if children is None:
            continue
        if depth > MAX_ARGUMENTS_DEPTH:
            raise errors.InvalidArguments(
                f"The arguments nest objects and arrays more than {MAX_ARGUMENTS_DEPTH} levels deep; "
                "send them flatter, as the tool's schema describes them."
            )
        pending.extend((child, depth + 1) for child in children)


def _explain(error: SchemaViolation) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [p for p in cast(list[str], error.validator_value) if p not in error.instance]
        names = ", ".join(f"`{'.'.join(filter(None, [where, p]))}`" for p in missing)
        return f"{names} {'is' if len(missing) == 1 else 'are'} required"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        return f"{error.message}" + (f" in `{where}`" if where else "")
    return f"`{where or 'arguments'}`: {error.message}"
