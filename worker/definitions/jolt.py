"""JOLT response transforms: `shift`, `default` and `remove`, run in sequence as JOLT's Chainr runs them.

Written after bazaarvoice/jolt (Shiftr, Defaultr, Removr and their test fixtures). A spec is a list of
`{operation, spec}` objects, or that list as JSON text. Any other operation (`modify-*`, `cardinality`,
`sort`, a Java class name) is refused when the spec is loaded, as is shift syntax this module does not
implement; references that point above the top of the spec are refused then too, so a loaded transform
never fails on the shape of its input: data that does not fit is skipped, as JOLT does.

Shift keys (left-hand side): literals, `*` patterns, `a|b`, `&` references, `@`, `@(n,path)`, `$`, `$(n,m)`
and `#literal`; `\\` escapes. Output paths (right-hand side): dotted keys with `&`, `&n`, `&(n,m)`,
`@(n,path)`, `[]`, `[n]`, `[&n]`, `[#n]`, `[@(n,path)]`; a list of paths writes to each; `""` is the root.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker.definitions.transforms import TransformError

JSON = Any
Step = Callable[[JSON], JSON]
SUPPORTED_OPERATIONS = ("shift", "default", "remove")
_JAVA_CLASSES = {
    "com.bazaarvoice.jolt.Shiftr": "shift",
    "com.bazaarvoice.jolt.Defaultr": "default",
    "com.bazaarvoice.jolt.Removr": "remove",
}
_ROOT = "root"
_MAX_INPUT_INDEX = 1_000_000


class _Absent:
    """A value that is not there (as opposed to a JSON null)."""


ABSENT: Any = _Absent()


@dataclass(frozen=True, slots=True)
class Jolt:
    """A compiled chain of JOLT operations; calling it transforms a parsed JSON document.

    Like JOLT, `default` and `remove` edit the document they are given, and `shift` places parts of its
    input in its output: the document passed in is the transform's to change (the worker parses each
    response for it).
    """

    steps: tuple[Step, ...]

    def __call__(self, data: JSON) -> JSON:
        for step in self.steps:
            data = step(data)
        return data


def jolt_transform(spec: Any) -> Jolt:
    """Compile a chain spec (a list of `{operation, spec}`, or its JSON text); raise `TransformError`."""
    entries = _chain_entries(spec)
    return Jolt(tuple(_compile_entry(index, entry) for index, entry in enumerate(entries)))


def _chain_entries(spec: Any) -> list[Any]:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise TransformError(f"JOLT spec is not valid JSON: {exc}") from exc
    if isinstance(spec, dict) and "operation" in spec:
        spec = [spec]
    if not isinstance(spec, list) or not spec:
        raise TransformError("a JOLT spec is a non-empty list of {operation, spec} objects")
    return spec


def _compile_entry(index: int, entry: Any) -> Step:
    if not isinstance(entry, dict) or not isinstance(entry.get("operation"), str):
        raise TransformError(f"JOLT step {index}: expected an object with an 'operation'")
    name = _JAVA_CLASSES.get(entry["operation"], entry["operation"])
    compilers: dict[str, Callable[[Any], Step]] = {"shift": Shift, "default": Default, "remove": Remove}
    if name not in compilers:
        supported = ", ".join(SUPPORTED_OPERATIONS)
        raise TransformError(f"JOLT operation {entry['operation']!r} is not supported (supported: {supported})")
    if not isinstance(entry.get("spec"), dict):
        raise TransformError(f"JOLT step {index} ({name}): 'spec' must be an object")
    try:
        return compilers[name](entry["spec"])
    except TransformError as exc:
        raise TransformError(f"JOLT step {index} ({name}): {exc}") from None


# ---------------------------------------------------------------------------------------------------------------
# The walked path: for each level from the root, the input found there and the key that matched it.


@dataclass(slots=True)
class _Match:
    """A matched input key, with what each `*` captured (index 0 is the whole key)."""

    groups: list[str]
    count: int = 0  # how many children matched so far: what `[#n]` reads

    @classmethod
    def of(cls, key: str, captures: Sequence[str] = ()) -> _Match:
        return cls([key, *captures])


@dataclass(slots=True)
class _Level:
    data: JSON
    match: _Match


Path = list[_Level]


@dataclass(frozen=True, slots=True)
class _Ref:
    """`&(up,group)`, `$(up,group)` or `#(up)`: the key matched `up` levels above, or one of its captures."""

    up: int
    group: int = 0

    def key(self, path: Path) -> str:
        return path[-1 - self.up].match.groups[self.group]

    def check(self, levels: Sequence[int], text: str) -> None:
        """`levels` holds the number of captures of each level on the path; refuse what cannot resolve."""
        if self.up >= len(levels):
            raise TransformError(f"{text!r} refers {self.up} levels up, but the spec is only {len(levels) - 1} deep")
        if self.group > levels[-1 - self.up]:
            raise TransformError(f"{text!r} refers to wildcard {self.group}, which that key does not have")


_REF = re.compile(r"^[&$#](?:(\d+)|\((\d+)(?:,(\d+))?\))?$")


def _parse_ref(text: str) -> _Ref:
    match = _REF.match(text)
    if match is None:
        raise TransformError(f"invalid reference {text!r}")
    up = match.group(1) or match.group(2) or "0"
    return _Ref(int(up), int(match.group(3) or 0))


# ---------------------------------------------------------------------------------------------------------------
# Keys and output path elements.


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _without_escaped(text: str) -> str:
    """The key with escaped characters dropped: what decides which kind of key it is."""
    return re.sub(r"\\.", "", text)


@dataclass(frozen=True, slots=True)
class _Literal:
    text: str

    def match(self, key: str, path: Path) -> _Match | None:
        return _Match.of(key) if key == self.text else None


@dataclass(frozen=True, slots=True)
class _Star:
    text: str
    pattern: re.Pattern[str] | None  # None for a lone `*`, which matches any key

    @classmethod
    def parse(cls, text: str) -> _Star:
        if text == "*":
            return cls(text, None)
        return cls(text, re.compile("^" + "(.+?)".join(re.escape(p) for p in text.split("*")) + "$"))

    @property
    def captures(self) -> int:
        return self.text.count("*") if self.pattern else 0

    @property
    def rank(self) -> int:
        """JOLT tries `&` keys first, then star keys with more stars before those with fewer, a lone `*` last."""
        return 5 if self.pattern is None else 2 if self.captures > 2 else 5 - self.captures

    def match(self, key: str, path: Path) -> _Match | None:
        if self.pattern is None:
            return _Match.of(key)
        found = self.pattern.match(key)
        return _Match.of(key, found.groups()) if found else None


@dataclass(frozen=True, slots=True)
class _Amp:
    """A key built from literal text and `&` references, like `photo-&(1,1)`."""

    text: str
    tokens: tuple[str | _Ref, ...]

    @classmethod
    def parse(cls, text: str) -> _Amp:
        tokens: list[str | _Ref] = []
        for part in re.split(r"(&[\d(),]*)", text):
            if part.startswith("&"):
                tokens.append(_parse_ref(part))
            elif part:
                tokens.append(part)
        return cls(text, tuple(tokens))

    def check(self, levels: Sequence[int]) -> None:
        for token in self.tokens:
            if isinstance(token, _Ref):
                token.check(levels, self.text)

    def evaluate(self, path: Path) -> str:
        return "".join(t if isinstance(t, str) else t.key(path) for t in self.tokens)

    def match(self, key: str, path: Path) -> _Match | None:
        return _Match.of(key) if self.evaluate(path) == key else None


@dataclass(frozen=True, slots=True)
class _At:
    """`@`: the input at the parent's level, under the parent's key."""

    def match(self, key: str, path: Path) -> _Match | None:
        return path[-1].match


@dataclass(frozen=True, slots=True)
class _Dollar:
    """`$`, `$(n,m)`: the matched key itself becomes the data."""

    ref: _Ref

    def match(self, key: str, path: Path) -> _Match | None:
        return _Match.of(self.ref.key(path))


@dataclass(frozen=True, slots=True)
class _Hash:
    """`#value`: a constant written as the data."""

    value: str

    def match(self, key: str, path: Path) -> _Match | None:
        return _Match.of(self.value)


@dataclass(frozen=True, slots=True)
class _Transpose:
    """`@(up,path)`: a value read from the input `up` levels above."""

    text: str
    up: int
    keys: tuple[_Segment, ...]

    @classmethod
    def parse(cls, text: str) -> _Transpose:
        meat = text[1:]
        if meat.startswith("("):
            if not meat.endswith(")"):
                raise TransformError(f"unbalanced parentheses in {text!r}")
            meat = meat[1:-1]
        if "@" in meat or "*" in meat or "[]" in meat:
            raise TransformError(f"{text!r} may not contain '@', '*' or '[]'")
        up, _, rest = meat.partition(",")
        if not _is_index(up):
            up, rest = "0", meat
        keys = tuple(_segment(s) for s in _split_dots(rest)) if rest else ()
        return cls(text, int(up), keys)

    def check(self, levels: Sequence[int]) -> None:
        _Ref(self.up).check(levels, self.text)
        for key in self.keys:
            key.check(levels)

    def lookup(self, path: Path) -> JSON:
        node = path[-1 - self.up].data
        for segment in self.keys:
            key = segment.evaluate(path)
            if key is None:
                return ABSENT
            node = _read(node, segment.kind, key)
        return node

    def match(self, key: str, path: Path) -> _Match | None:
        return path[-1].match

    def as_key(self, path: Path) -> str | None:
        value = self.lookup(path)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
            return str(int(value))
        return value if isinstance(value, str) else None


Key = _Literal | _Star | _Amp | _At | _Dollar | _Hash | _Transpose
_SPECIAL = (_At, _Dollar, _Hash, _Transpose)


def _lhs_key(text: str) -> Key:
    kind, plain = _without_escaped(text), _unescape(text)
    if kind == "@":
        return _At()
    if kind.startswith("@") or "@(" in kind:
        return _Transpose.parse(text)
    if "[" in kind or "@" in kind:
        raise TransformError(f"shift key {text!r} is not supported ('[...]' and '@' inside a key)")
    if "$" in kind:
        return _Dollar(_parse_ref(plain))
    if "&" in kind:
        if "*" in kind:
            raise TransformError(f"shift key {text!r} mixes '*' with '&'")
        return _Amp.parse(plain)
    if "*" in kind:
        return _Star.parse(plain)
    if "#" in kind:
        if not plain.startswith("#") or len(plain) < 2:
            raise TransformError(f"shift key {text!r}: '#' starts a constant, like '#enabled'")
        return _Hash(plain[2:-1] if plain.startswith("#(") and plain.endswith(")") else plain[1:])
    return _Literal(plain)


def _key_captures(key: Key, levels: Sequence[int]) -> int:
    """How many `*` captures the level this key adds to the path offers to references."""
    if isinstance(key, _Star):
        return key.captures
    return levels[-1] if isinstance(key, _At | _Transpose) else 0


def _check_key(key: Key, levels: Sequence[int]) -> None:
    if isinstance(key, _Amp | _Transpose):
        key.check(levels)
    elif isinstance(key, _Dollar):
        key.ref.check(levels, "$")


# ---------------------------------------------------------------------------------------------------------------
# Output paths: a list of segments, each a map key, an array index, or `[]` (append).

_MAP, _INDEX, _APPEND = "map", "index", "append"


def _no_check(levels: Sequence[int]) -> None:
    return None


@dataclass(frozen=True, slots=True)
class _Segment:
    kind: str
    text: str
    evaluate: Callable[[Path], str | None]
    check: Callable[[Sequence[int]], None] = _no_check


def _split_dots(text: str) -> list[str]:
    """Split a dotted path on unescaped dots outside `@(...)`, separating `a[1]` into `a` and `[1]`."""
    segments = [""]
    index = 0
    while index < len(text):
        end = _token_end(text, index)
        token = text[index:end]
        if token == ".":
            segments.append("")
        elif token == "[" and segments[-1] and not segments[-1].endswith("@"):
            segments.append(token)
        else:
            segments[-1] += token
        index = end
    return [s for s in segments if s]


def _token_end(text: str, index: int) -> int:
    """The end of the token at `index`: an escape pair, a whole `@(...)`, or one character."""
    if text[index] == "\\":
        return index + 2
    if text.startswith("@(", index):
        close = text.find(")", index)
        if close < 0:
            raise TransformError(f"unbalanced parentheses in {text!r}")
        return close + 1
    return index + 1


def _segment(text: str) -> _Segment:
    kind, plain = _without_escaped(text), _unescape(text)
    if kind.startswith("["):
        return _index_segment(text)
    if kind.startswith("@") and kind != "@":
        transpose = _Transpose.parse(text)
        return _Segment(_MAP, text, transpose.as_key, transpose.check)
    if "*" in kind or "$" in kind or "#" in kind or "@" in kind:
        raise TransformError(f"output path element {text!r} may not contain '*', '$', '#' or '@' here")
    if "&" in kind:
        amp = _Amp.parse(plain)
        return _Segment(_MAP, text, amp.evaluate, amp.check)
    return _Segment(_MAP, text, lambda path: plain)


def _index_segment(text: str) -> _Segment:
    if not text.endswith("]"):
        raise TransformError(f"unbalanced brackets in {text!r}")
    inner = text[1:-1]
    if not inner:
        return _Segment(_APPEND, text, lambda path: "")
    if _is_index(inner):
        return _Segment(_INDEX, text, lambda path: inner)
    if inner.startswith("#"):
        ref = _parse_ref(inner)
        return _Segment(_INDEX, text, lambda path: str(path[-1 - ref.up].match.count), lambda lv: ref.check(lv, text))
    if inner.startswith("&"):
        ref = _parse_ref(inner)
        return _Segment(_INDEX, text, lambda path: _index(ref.key(path)), lambda lv: ref.check(lv, text))
    if inner.startswith("@"):
        transpose = _Transpose.parse(inner)
        return _Segment(_INDEX, text, lambda path: _index(transpose.as_key(path)), transpose.check)
    raise TransformError(f"bad array index {text!r}")


def _is_index(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _index(key: str | None) -> str | None:
    """An index taken from the input; one far beyond any response's length would only pad memory with nulls."""
    return key if key is not None and _is_index(key) and int(key) <= _MAX_INPUT_INDEX else None


@dataclass(frozen=True, slots=True)
class _Writer:
    """One output path of a shift leaf."""

    segments: tuple[_Segment, ...]

    @classmethod
    def parse(cls, rhs: Any, levels: Sequence[int]) -> _Writer:
        if not isinstance(rhs, str):
            raise TransformError(f"an output path must be a string, not {rhs!r}")
        if re.search(r"(?<!\\)[*$]", rhs):
            raise TransformError(f"output path {rhs!r} may not contain '*' or '$'")
        segments = (_segment(_ROOT), *(_segment(s) for s in _split_dots(rhs)))
        for segment in segments:
            segment.check(levels)
        return cls(segments)

    def write(self, value: JSON, output: dict[str, JSON], path: Path) -> None:
        keys = [segment.evaluate(path) for segment in self.segments]
        if any(key is None for key in keys):
            return  # a reference that does not resolve to a usable key: JOLT skips the write
        steps = [(segment.kind, str(key)) for segment, key in zip(self.segments, keys, strict=True)]
        _put(output, steps, value)


def _read(node: JSON, kind: str, key: str) -> JSON:
    if kind == _MAP and isinstance(node, dict):
        return node.get(key, ABSENT)
    if kind == _INDEX and isinstance(node, list) and int(key) < len(node):
        return node[int(key)]
    return ABSENT


def _put(tree: JSON, steps: list[tuple[str, str]], value: JSON) -> None:
    """Write `value` at `steps`, creating containers on the way; a value already there becomes a list."""
    node = tree
    for position, (kind, key) in enumerate(steps):
        if not isinstance(node, list if kind != _MAP else dict):
            return  # the output already holds something of another shape here
        existing = None if kind == _APPEND else _read(node, kind, key)
        existing = None if existing is ABSENT else existing
        if position == len(steps) - 1:
            _set(node, kind, key, _accumulate(existing, value))
            return
        if existing is None:
            existing = {} if steps[position + 1][0] == _MAP else []
            _set(node, kind, key, existing)
        node = existing


def _accumulate(existing: JSON, value: JSON) -> JSON:
    if existing is None:
        return value
    if isinstance(existing, list):
        existing.append(value)
        return existing
    return [existing, value]


def _set(node: Any, kind: str, key: str, value: JSON) -> None:
    if kind == _MAP:
        node[key] = value
    elif kind == _APPEND:
        node.append(value)
    else:
        index = int(key)
        node.extend([None] * (index + 1 - len(node)))
        node[index] = value


# ---------------------------------------------------------------------------------------------------------------
# shift


def _entries(data: JSON) -> dict[str, JSON]:
    """The input at one level as key -> value: list indexes are keys, and a scalar is a key without a value."""
    if isinstance(data, dict):
        return dict(data)  # a snapshot: an `@` written to the output root makes the output alias this input
    if isinstance(data, list):
        return {str(index): value for index, value in enumerate(data)}
    if data is None:
        return {}
    return {_scalar_key(data): None}


def _scalar_key(value: JSON) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _ShiftLeaf:
    def __init__(self, key: Key, rhs: Any, levels: Sequence[int]) -> None:
        if not isinstance(rhs, str | list) and rhs is not None:
            raise TransformError(f"a shift value must be an object, an output path or a list of them, not {rhs!r}")
        self.key = key
        own = (*levels, _key_captures(key, levels))
        paths = rhs if isinstance(rhs, list) else [] if rhs is None else [rhs]
        self.writers = [_Writer.parse(p, own) for p in paths]

    def apply(self, input_key: str, data: JSON, path: Path, output: dict[str, JSON]) -> bool:
        match = self.key.match(input_key, path)
        if match is None:
            return False
        value = data
        if isinstance(self.key, _Dollar | _Hash):
            value = match.groups[0]
        elif isinstance(self.key, _Transpose):
            value = self.key.lookup(path)
            if value is ABSENT:
                return False
        path.append(_Level(data, match))
        for writer in self.writers:
            writer.write(value, output, path)
        path.pop()
        matched_input = not isinstance(self.key, _SPECIAL)
        if matched_input:
            path[-1].match.count += 1
        return matched_input


class _ShiftNode:
    def __init__(self, key: Key, spec: dict[str, Any], levels: Sequence[int]) -> None:
        if isinstance(key, _At | _Dollar | _Hash):
            raise TransformError("'@', '$' and '#' keys cannot have children")
        if not spec:
            raise TransformError("a shift key cannot have an empty {} as its value")
        self.key = key
        own = (*levels, _key_captures(key, levels))
        children = [_shift_child(k, v, own) for raw, v in spec.items() for k in str(raw).split("|")]
        self.special = [c for c in children if isinstance(c.key, _SPECIAL)]
        self.literal = {c.key.text: c for c in children if isinstance(c.key, _Literal)}
        computed = [c for c in children if isinstance(c.key, _Star | _Amp)]
        self.computed = sorted(computed, key=_priority)
        self.conflict = any(
            not isinstance(c.key, _Star) or any(c.key.match(k, []) for k in self.literal) for c in self.computed
        )

    def apply(self, input_key: str, data: JSON, path: Path, output: dict[str, JSON]) -> bool:
        match = self.key.match(input_key, path)
        if match is None:
            return False
        if isinstance(self.key, _Transpose):
            data = self.key.lookup(path)
            if data is ABSENT:
                return False
        path.append(_Level(data, match))
        for child in self.special:
            child.apply(input_key, data, path, output)
        self._apply_children(_entries(data), path, output)
        path.pop()
        path[-1].match.count += 1
        return True

    def _apply_children(self, entries: dict[str, JSON], path: Path, output: dict[str, JSON]) -> None:
        # The order mirrors JOLT's execution strategies, so implicit arrays fill in the same order.
        if self.conflict:
            for key, value in entries.items():
                literal = self.literal.get(key)
                if literal is not None:
                    literal.apply(key, value, path, output)
                else:
                    self._apply_computed(key, value, path, output)
            return
        for key, child in self.literal.items():
            if key in entries:
                child.apply(key, entries[key], path, output)
        if self.computed:
            for key, value in entries.items():
                self._apply_computed(key, value, path, output)

    def _apply_computed(self, key: str, value: JSON, path: Path, output: dict[str, JSON]) -> None:
        for child in self.computed:
            if child.apply(key, value, path, output):
                return


_ShiftChild = _ShiftLeaf | _ShiftNode


def _shift_child(raw_key: str, rhs: Any, levels: Sequence[int]) -> _ShiftChild:
    key = _lhs_key(raw_key)
    _check_key(key, levels)
    if isinstance(rhs, dict):
        return _ShiftNode(key, rhs, levels)
    return _ShiftLeaf(key, rhs, levels)


def _priority(child: _ShiftChild) -> tuple[int, int, str]:
    key = child.key
    assert isinstance(key, _Star | _Amp)
    return (1 if isinstance(key, _Amp) else key.rank), -len(key.text), key.text


class Shift:
    """JOLT `shift`: copy each matched input value to the output paths of its spec key."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.root = _ShiftNode(_Literal(_ROOT), spec, (0,))

    def __call__(self, data: JSON) -> JSON:
        output: dict[str, JSON] = {}
        self.root.apply(_ROOT, data, [_Level(data, _Match.of(_ROOT))], output)
        return output.get(_ROOT)


# ---------------------------------------------------------------------------------------------------------------
# default


class _DefaultKey:
    """One key of a default spec: a literal (created when missing), `a|b` or `*` (existing keys only)."""

    def __init__(self, raw: str, spec: Any, in_array: bool) -> None:
        self.in_array = in_array
        self.is_array = raw.endswith("[]")
        self.raw = raw.removesuffix("[]")
        if "*" in self.raw and self.raw != "*":
            raise TransformError(f"default key {raw!r}: '*' must stand alone")
        self.names = [] if self.raw == "*" else self.raw.split("|")
        if in_array and not all(_is_index(n) for n in self.names):
            raise TransformError(f"default key {raw!r}: keys under an array ('name[]') must be indexes")
        self.children: list[_DefaultKey] | None = None
        self.value = spec
        if isinstance(spec, dict):
            children = [_DefaultKey(str(k), v, self.is_array) for k, v in spec.items()]
            self.children = sorted(children, key=lambda c: c.precedence)

    @property
    def precedence(self) -> tuple[int, int, str]:
        """Literals first, then `a|b` keys (fewest choices first), then `*`."""
        if not self.names:
            return 2, 0, ""
        return (0, 0, "") if len(self.names) == 1 else (1, len(self.names), self.raw)

    def apply_children(self, container: JSON) -> None:
        if self.children is None:
            return
        if self.is_array and isinstance(container, list):
            literal_indexes = [int(c.names[0]) for c in self.children if len(c.names) == 1]
            container.extend([None] * (max(literal_indexes, default=-1) + 1 - len(container)))
        for child in self.children:
            child.apply_to(container)

    def apply_to(self, container: JSON) -> None:
        for key in self._targets(container):
            current = container[key] if isinstance(container, list) else container.get(key)
            if self.children is None:
                if current is None:
                    container[key] = copy.deepcopy(self.value)
                continue
            if current is None:
                current = [] if self.is_array else {}
                container[key] = current
            self.apply_children(current)

    def _targets(self, container: JSON) -> list[Any]:
        """Where this key applies: keys of an object, or indexes of an array when the parent is `name[]`."""
        if isinstance(container, dict) and not self.in_array:
            if not self.names:
                return list(container)
            return self.names if len(self.names) == 1 else [n for n in self.names if n in container]
        if isinstance(container, list) and self.in_array:
            indexes = [int(n) for n in self.names] if self.names else range(len(container))
            return [i for i in indexes if i < len(container)]
        return []


class Default:
    """JOLT `default`: fill in keys that are missing or null, walking the spec."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.root = _DefaultKey(_ROOT, spec, in_array=False)
        indexes_only = all(_is_index(n) or n == "*" for key in spec for n in str(key).removesuffix("[]").split("|"))
        self.array_root = _DefaultKey(_ROOT + "[]", spec, in_array=False) if indexes_only else None

    def __call__(self, data: JSON) -> JSON:
        if data is None:
            data = {}
        if isinstance(data, list):
            if self.array_root is not None:
                self.array_root.apply_children(data)
            return data
        self.root.apply_children(data)
        return data


# ---------------------------------------------------------------------------------------------------------------
# remove


class _RemoveKey:
    def __init__(self, raw: str, spec: Any) -> None:
        self.key: _Literal | _Star = _Star.parse(raw) if "*" in raw else _Literal(raw)
        self.children: list[_RemoveKey] | None = None
        if isinstance(spec, dict):
            self.children = [_RemoveKey(k, v) for raw_key, v in spec.items() for k in str(raw_key).split("|")]
        elif not (isinstance(spec, str) and not spec.strip()):
            raise TransformError(f'remove key {raw!r}: the value must be "" (remove) or an object, not {spec!r}')

    def matching(self, container: JSON) -> list[Any]:
        if isinstance(container, dict):
            return [k for k in container if self.key.match(k, [])]
        if isinstance(container, list) and isinstance(self.key, _Literal):
            text = self.key.text
            return [int(text)] if _is_index(text) and int(text) < len(container) else []
        if isinstance(container, list) and isinstance(self.key, _Star) and self.key.pattern is None:
            return list(range(len(container)))
        return []

    def apply_children(self, container: JSON) -> None:
        doomed: set[Any] = set()
        for child in self.children or []:
            targets = child.matching(container)
            if child.children is None:
                doomed.update(targets)
            else:
                for target in targets:
                    child.apply_children(container[target])
        for target in sorted(doomed, reverse=True):
            del container[target]


class Remove:
    """JOLT `remove`: delete the keys that the spec names."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.root = _RemoveKey(_ROOT, spec)

    def __call__(self, data: JSON) -> JSON:
        if isinstance(data, dict | list):
            self.root.apply_children(data)
        return data
