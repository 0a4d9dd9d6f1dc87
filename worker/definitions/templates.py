"""Templates of tool definitions: `${arg}`, `${env:NAME}`, `${env:NAME:-default}`, `${file:/path}` (a mounted
secret, read when the definitions are loaded, trailing newline stripped); `$${` is a literal `${`.

A template is parsed once, at load time, into literal text and placeholders. Rendering is left to
`rendering.py`, which decides how a value is encoded where it lands (path segment, query, JSON text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_PLACEHOLDER = re.compile(r"\$\$\{|\$\{([^{}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TemplateSyntaxError(ValueError):
    """A template cannot be parsed."""


@dataclass(frozen=True, slots=True)
class Arg:
    name: str


@dataclass(frozen=True, slots=True)
class Env:
    name: str
    default: str | None = None


@dataclass(frozen=True, slots=True)
class File(Env):
    """A secret read from a file at load time (`name` is its path); None when it could not be read."""

    content: str | None = None


Part = str | Arg | Env


@dataclass(frozen=True, slots=True)
class Template:
    parts: tuple[Part, ...]
    source: str

    @classmethod
    def parse(cls, text: str) -> Template:
        return cls(tuple(_parse_parts(text)), text)

    @classmethod
    def literal(cls, text: str) -> Template:
        return cls((text,) if text else (), text)

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts if isinstance(p, Arg))

    @property
    def env_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts if isinstance(p, Env))

    @property
    def single_arg(self) -> str | None:
        """The argument name when the template is exactly `${name}`."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Arg):
            return self.parts[0].name
        return None


def escape(text: str) -> str:
    """Literal text as a template (text from a spec or another format may contain `${`)."""
    return text.replace("${", "$${")


class MissingEnv(LookupError):
    """An `${env:NAME}` without default names a variable the worker does not have."""


def resolve_env(part: Env, environ: Mapping[str, str]) -> str:
    """Like the shell's `${NAME:-default}`: the default also stands in for an empty value. A file's content
    as it was read."""
    if isinstance(part, File):
        if part.content is None:
            raise MissingEnv(f"the secret file {part.name}")
        return part.content
    value = environ.get(part.name)
    if value:
        return value
    if part.default is not None:
        return part.default
    if value is not None:
        return value
    raise MissingEnv(part.name)


def _parse_parts(text: str) -> list[Part]:
    parts: list[Part] = []
    literal: list[str] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(text):
        literal.append(_checked_literal(text[pos : match.start()], text))
        pos = match.end()
        if match.group(1) is None:  # the `$${` escape
            literal.append("${")
            continue
        if literal and "".join(literal):
            parts.append("".join(literal))
        literal = []
        parts.append(_placeholder(match.group(1), text))
    literal.append(_checked_literal(text[pos:], text))
    if "".join(literal):
        parts.append("".join(literal))
    return parts


def _checked_literal(chunk: str, text: str) -> str:
    if "${" in chunk:
        raise TemplateSyntaxError(f"unterminated placeholder in {text!r} (write $${{ for a literal ${{)")
    return chunk


def _placeholder(inner: str, text: str) -> Arg | Env:
    inner = inner.strip()
    if inner.startswith("file:"):
        return _file(inner[5:], text)
    if inner.startswith("env:"):
        name, _, default = inner[4:].partition(":-")
        if not _ENV_NAME.match(name):
            raise TemplateSyntaxError(f"bad environment variable name {name!r} in {text!r}")
        return Env(name, default if ":-" in inner else None)
    if not inner:
        raise TemplateSyntaxError(f"empty placeholder in {text!r}")
    return Arg(inner)


def _file(path: str, text: str) -> File:
    if not path.startswith("/"):
        raise TemplateSyntaxError(f"a secret file must be an absolute path in {text!r}")
    try:
        content = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError:
        content = None  # reported by `toolworker validate`; a call that needs it ends with 78
    return File(path, content=content)
