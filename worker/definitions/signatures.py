"""A tool as a Python signature, for programs (code mode): `async def name(arg: type, ...) -> type:` with a
docstring made from its description and its input and output schemas.

The method a program calls is `tools.<python_name(tool)>`; arguments go by keyword. An argument whose name
cannot be a Python keyword argument (`page[size]`, `from`) is listed in the docstring, passed through
`**arguments` (`tools.x(**{"page[size]": 10})`).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping
from typing import Any

from worker.definitions.model import Tool

_NOT_IDENTIFIER = re.compile(r"\W")
_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
_MAX_DEPTH = 3


def python_name(tool: str) -> str:
    """The method name of a tool on `tools` (characters a name cannot hold become `_`)."""
    name = _NOT_IDENTIFIER.sub("_", tool)
    if not name or name[0].isdigit():
        name = "_" + name
    return name + "_" if keyword.iskeyword(name) else name


def python_type(schema: Any, depth: int = 0) -> str:
    """A JSON schema as a Python type annotation (`Any` for what it cannot say)."""
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return "Any"
    variants = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(variants, list) and variants:
        return _union([python_type(v, depth + 1) for v in variants])
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([python_type({**schema, "type": k}, depth + 1) for k in kind])
    if kind == "array":
        return f"list[{python_type(schema.get('items'), depth + 1)}]"
    if kind == "object" or "properties" in schema:
        return "dict"
    return _SCALARS.get(str(kind), "Any")


def _union(types: list[str]) -> str:
    unique = list(dict.fromkeys(types))
    return "Any" if "Any" in unique else " | ".join(unique)


def signature(tool: Tool) -> str:
    """The tool's `async def` with its docstring (valid Python: it parses with `ast`)."""
    schema = tool.input_schema
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    usable = [n for n in properties if n.isidentifier() and not keyword.iskeyword(n)]
    others = [n for n in properties if n not in usable]
    params = [f"{n}: {python_type(properties[n])}" for n in usable if n in required]
    params += [f"{n}: {python_type(properties[n])} | None = None" for n in usable if n not in required]
    parts = (["*", *params] if params else []) + (["**arguments: Any"] if others else [])
    head = f"async def {python_name(tool.name)}({', '.join(parts)}) -> {_returns(tool.output_schema)}:"
    return head + "\n" + _docstring(tool, properties, required, others)


def _returns(output: Mapping[str, Any] | None) -> str:
    """What the call returns: the structured answer's type, else `dict | list | str` (JSON or text)."""
    if output is None:
        return "dict | list | str"
    return python_type(output)


def _docstring(tool: Tool, properties: Mapping[str, Any], required: set[str], others: list[str]) -> str:
    lines = [_safe(tool.description.strip() or tool.name), "", "Args:"]
    for name, spec in properties.items():
        text = spec.get("description", "") if isinstance(spec, Mapping) else ""
        mark = "" if name in required else " (optional)"
        passed = f' (pass as **{{"{name}": ...}})' if name in others else ""
        lines.append(f"    {name}{mark}{passed}: {_safe(str(text)).splitlines()[0] if text else ''}".rstrip())
    if tool.output_schema is not None:
        lines += ["", "Returns:", f"    {python_type(tool.output_schema)} matching the tool's output schema."]
    body = "\n".join("    " + line if line else "" for line in lines)
    return f'    """{body.strip()}\n    """'


def _safe(text: str) -> str:
    """Text that cannot end the docstring early."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
