"""The catalog (docs/guides/definitions.md): which tools there are, their schemas, search, and exports for LLM APIs.

Pure functions over a `ToolSet`. Listing and search read only what a tool has without its input schema
(name, method, path, description, tags, the argument names its templates use), so a spec of thousands
of operations is listed and searched without building one lazy schema.

What each consumer accepts, as their APIs answer when they refuse a tool:
- OpenAI function tools `{"type": "function", "function": {name, description, parameters}}`: name
  `^[a-zA-Z0-9_-]{1,64}$`; description at most 1024 characters (`string_above_max_length`); parameters
  an object schema without oneOf/anyOf/allOf/enum/not at the top level; every array schema has `items`
  ("array schema missing items").
- Anthropic tools `{name, description, input_schema}`: name `^[a-zA-Z0-9_-]{1,64}$`; input_schema of type
  object without oneOf/allOf/anyOf at the top level; property keys `^[a-zA-Z0-9_.-]{1,64}$` (the OpenAPI
  reader names arguments so; native definitions choose their own and must follow it for Anthropic).
- MCP `tools/list` entries `{name, description, inputSchema, annotations?, execution}` (execution.taskSupport:
  the tool's task mode): inputSchema an object schema,
  JSON Schema 2020-12 unless `$schema` says otherwise; annotations are hints (readOnlyHint,
  destructiveHint, idempotentHint, openWorldHint) derived here from the HTTP method.
All three get schemas without `$schema`, `$id`, `$comment`, `$anchor`, `x-*` keys, and without `$ref`s
that do not point into the schema itself; the top level is always `type: object` with `properties`
(variants of a top-level union are merged into them). OpenAI and Anthropic also lose `examples` and
`example`: neither documents them for tools, and they cost tokens on every request.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from worker.constants import KIND_CATALOG, KIND_DEFINED, KIND_HTTP_REQUEST, KIND_MCP
from worker.definitions.model import (
    DEFAULT_TASK_MODE,
    DEFINITIONS_KEYWORDS,
    SUBSCHEMA_KEYWORDS,
    SUBSCHEMA_LIST_KEYWORDS,
    SUBSCHEMA_MAP_KEYWORDS,
    Tool,
    ToolSet,
)

JSON = Any
OPENAI_DESCRIPTION_LIMIT = 1024
_BM25_K1 = 1.2
_BM25_B = 0.75
# How much a term counts by where it was found: a tool's name says more than its prose.
_FIELD_WEIGHTS = {"name": 3.0, "tags": 2.0, "parameters": 1.5, "path": 1.0, "description": 1.0}
_WORD = re.compile(r"[A-Za-z0-9]+")
_STOPWORDS = frozenset(
    _WORD.findall(
        "a an and are as at be by can do does for from how i in is it me my of on or please the this to what "
        "when which who with you your"
    )
)
_WORD_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


# --- listing and schemas -------------------------------------------------------------------------


def summary(tool: Tool) -> dict[str, JSON]:
    """The light description of a tool: never builds its input schema."""
    return {
        "name": tool.name,
        "method": tool.request.method,
        "path": tool.request.path.source,
        "summary": tool.summary,
        "tags": list(tool.tags),
        "upstream": tool.upstream,
    }


def definition(tool: Tool) -> dict[str, JSON]:
    """Everything a caller needs to call a tool, with its (built) input schema, and its output schema if any."""
    described = {**summary(tool), "description": tool.description, "inputSchema": dict(tool.input_schema)}
    if tool.output_schema is not None:
        described["outputSchema"] = dict(tool.output_schema)
    return described


def list_tools(toolset: ToolSet, tags: Iterable[str] | None = None) -> list[dict[str, JSON]]:
    """Light summaries of the tools, by name; with `tags`, only the tools that have one of them."""
    wanted = set(tags or ())
    tools = sorted(toolset.tools.values(), key=lambda t: t.name)
    return [summary(t) for t in tools if not wanted or wanted & set(t.tags)]


def schemas(toolset: ToolSet, names: Iterable[str]) -> dict[str, list[JSON]]:
    """The full definitions of the named tools, and the names that are not tools."""
    names = list(dict.fromkeys(names))
    return {
        "tools": [definition(toolset.tools[n]) for n in names if n in toolset.tools],
        "missing": [n for n in names if n not in toolset.tools],
    }


def upstream_tools(toolset: ToolSet, upstream: str) -> list[dict[str, JSON]]:
    """Light summaries of the tools that call one upstream."""
    return [s for s in list_tools(toolset) if s["upstream"] == upstream]


# --- search --------------------------------------------------------------------------------------


def terms(text: str) -> list[str]:
    """Lower-case word stems: `getPetById` -> get, pet, by, id; stop words dropped."""
    words = (part for word in _WORD.findall(text) for part in _WORD_PART.findall(word))
    return [_stem(w.lower()) for w in words if w.lower() not in _STOPWORDS]


def _stem(word: str) -> str:
    """Plurals to singular, enough for `pets` to find `pet`; the same on both sides of a match."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _argument_names(tool: Tool) -> list[str]:
    """Argument names known without building a lazy schema: those the templates use."""
    names = [name for template in tool.request.templates for name in template.arg_names]
    if not tool.schema_is_lazy:
        names.extend(tool.input_schema.get("properties", {}))
    return names


def _weighted_terms(tool: Tool) -> dict[str, float]:
    fields = {
        "name": tool.name,
        "tags": " ".join(tool.tags),
        "parameters": " ".join(dict.fromkeys(_argument_names(tool))),
        "path": re.sub(r"\$\{[^}]*\}", " ", tool.request.path.source),
        "description": tool.description,
    }
    counts: dict[str, float] = defaultdict(float)
    for field, text in fields.items():
        for term in terms(text):
            counts[term] += _FIELD_WEIGHTS[field]
    return counts


class SearchIndex:
    """BM25 over each tool's name, tags, argument names, path and description; build once, query often."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self.tools = list(tools)
        self.postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        lengths = []
        for index, tool in enumerate(self.tools):
            counts = _weighted_terms(tool)
            lengths.append(float(sum(counts.values())))
            for term, weight in counts.items():
                self.postings[term].append((index, weight))
        self.lengths = lengths
        self.average_length = sum(lengths) / len(lengths) if lengths else 1.0

    def search(self, question: str, top_k: int = 5) -> list[tuple[Tool, float]]:
        """The best-matching tools with their scores, best first; tools that match no term are left out."""
        scores: dict[int, float] = defaultdict(float)
        for term in set(terms(question)):
            postings = self.postings.get(term, [])
            idf = math.log(1 + (len(self.tools) - len(postings) + 0.5) / (len(postings) + 0.5))
            for index, weight in postings:
                scores[index] += idf * self._saturated(weight, index)
        best = heapq.nsmallest(max(top_k, 0), scores.items(), key=lambda item: (-item[1], self.tools[item[0]].name))
        return [(self.tools[index], score) for index, score in best]

    def _saturated(self, weight: float, index: int) -> float:
        norm = 1 - _BM25_B + _BM25_B * self.lengths[index] / self.average_length
        return weight * (_BM25_K1 + 1) / (weight + _BM25_K1 * norm)


# The arguments of a catalog search, as the catalog tools and the gateway's discovery mode offer it.
SEARCH_SCHEMA: dict[str, JSON] = {
    "type": "object",
    "properties": {
        "question": {"type": "string", "minLength": 1},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
    },
    "required": ["question"],
    "additionalProperties": False,
}


def search(toolset: ToolSet, question: str, top_k: int = 5) -> list[dict[str, JSON]]:
    """The `top_k` tools that best match a question, as light summaries with a `score`."""
    return [{**summary(tool), "score": round(score, 4)} for tool, score in _index(toolset).search(question, top_k)]


# The index of the toolset searched last (a worker serves one at a time; building one for 1,000 tools
# takes about 0.1 s of its event loop). Keyed by the tools themselves, which the index keeps alive.
_last_index: tuple[tuple[int, ...], SearchIndex] | None = None


def _index(toolset: ToolSet) -> SearchIndex:
    global _last_index
    key = tuple(map(id, toolset.tools.values()))
    cached = _last_index
    if cached is None or cached[0] != key:
        cached = _last_index = (key, SearchIndex(toolset.tools.values()))
    return cached[1]


# --- exports -------------------------------------------------------------------------------------

ToolLike = Tool | Mapping[str, JSON]  # a Tool, or a definition as `schemas()` returns it


def to_openai(tools: Iterable[ToolLike]) -> list[dict[str, JSON]]:
    """OpenAI function-calling tools (Chat Completions `tools`)."""
    out = []
    for item in tools:
        d = _definition(item)
        function = {
            "name": d["name"],
            "description": _truncate(d["description"], OPENAI_DESCRIPTION_LIMIT),
            "parameters": export_schema(d["inputSchema"], keep_examples=False),
        }
        out.append({"type": "function", "function": function})
    return out


def to_anthropic(tools: Iterable[ToolLike]) -> list[dict[str, JSON]]:
    """Anthropic Messages API tools."""
    return [
        {"name": d["name"], "description": d["description"], "input_schema": export_schema(d["inputSchema"], False)}
        for d in map(_definition, tools)
    ]


def to_mcp(tools: Iterable[ToolLike]) -> list[dict[str, JSON]]:
    """MCP `tools/list` result entries (an `outputSchema` as 2026-07-28 takes it: any root)."""
    return [_mcp_entry(item, _definition(item)) for item in tools]


def _mcp_entry(item: ToolLike, d: Mapping[str, JSON]) -> dict[str, JSON]:
    entry = {
        "name": d["name"],
        "description": d["description"],
        "inputSchema": export_schema(d["inputSchema"], keep_examples=True),
        "annotations": _mcp_annotations(item, d["method"]),
        "execution": {"taskSupport": item.task_mode if isinstance(item, Tool) else DEFAULT_TASK_MODE},
    }
    if d.get("outputSchema") is not None:
        entry["outputSchema"] = d["outputSchema"]
    if isinstance(item, Tool) and item.title:
        entry["title"] = item.title
    return entry


def _definition(item: ToolLike) -> Mapping[str, JSON]:
    return definition(item) if isinstance(item, Tool) else item


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# The catalog tools only read the definitions the worker holds: nothing changes, nothing outside is reached.
_CATALOG_HINTS = {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}
# The generic tool sends whatever method the model picks: MCP's defaults, which assume the worst.
_ANY_METHOD_HINTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}


def _mcp_annotations(item: ToolLike, method: str) -> dict[str, JSON]:
    """Hints from what answers the tool: the built-in tools by their kind (their method is a placeholder),
    the others from the HTTP method."""
    kind = item.kind if isinstance(item, Tool) else KIND_DEFINED
    if isinstance(item, Tool) and kind == KIND_MCP:  # the server's own hints, else MCP's defaults
        return dict(item.annotations or _ANY_METHOD_HINTS)
    if kind == KIND_CATALOG:
        return dict(_CATALOG_HINTS)
    if kind == KIND_HTTP_REQUEST:
        return dict(_ANY_METHOD_HINTS)
    return _method_annotations(method)


def _method_annotations(method: str) -> dict[str, bool]:
    """Hints from the HTTP method: safe methods read, DELETE destroys, PUT and DELETE are idempotent."""
    method = method.upper()
    hints = {"readOnlyHint": method in _SAFE_METHODS, "openWorldHint": True}
    if method not in _SAFE_METHODS:
        hints["destructiveHint"] = method == "DELETE"
        hints["idempotentHint"] = method in {"PUT", "DELETE"}
    return hints


_DROPPED_KEYWORDS = frozenset({"$schema", "$id", "$comment", "$anchor", "$dynamicAnchor", "$dynamicRef", "$vocabulary"})
_EXAMPLE_KEYWORDS = frozenset({"examples", "example"})
_SUBSCHEMA_MAPS = SUBSCHEMA_MAP_KEYWORDS | DEFINITIONS_KEYWORDS
_TOP_LEVEL_UNIONS = ("allOf", "anyOf", "oneOf")


def export_schema(schema: Mapping[str, JSON], keep_examples: bool) -> dict[str, JSON]:
    """An input schema as LLM APIs take it: an object at the top, without what they refuse."""
    dropped = _DROPPED_KEYWORDS if keep_examples else _DROPPED_KEYWORDS | _EXAMPLE_KEYWORDS
    cleaned = _Cleaner(schema, dropped).clean(schema)
    return _object_top(cleaned if isinstance(cleaned, dict) else {})


class _Cleaner:
    def __init__(self, root: Mapping[str, JSON], dropped: frozenset[str]) -> None:
        self.root = root
        self.dropped = dropped

    def clean(self, node: JSON) -> JSON:
        if isinstance(node, bool):
            return node
        if not isinstance(node, Mapping):
            return {}
        out: dict[str, JSON] = {}
        for key, value in node.items():
            if key in self.dropped or key.startswith("x-") or (key == "$ref" and not self._resolves(value)):
                continue
            if key in SUBSCHEMA_KEYWORDS:
                out[key] = self.clean(value)
            elif key in SUBSCHEMA_LIST_KEYWORDS and isinstance(value, list):
                out[key] = [self.clean(v) for v in value]
            elif key in _SUBSCHEMA_MAPS and isinstance(value, Mapping):
                out[key] = {k: self.clean(v) for k, v in value.items()}
            else:
                out[key] = value
        if _is_array(out) and "items" not in out and "prefixItems" not in out:
            out["items"] = {}
        return out

    def _resolves(self, ref: JSON) -> bool:
        """Whether a `$ref` points into the schema itself (anything else is unknown to the consumer)."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return False
        node: JSON = self.root
        for token in ref[1:].split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or token not in node:
                return False
            node = node[token]
        return True


def _is_array(schema: Mapping[str, JSON]) -> bool:
    kind = schema.get("type")
    return kind == "array" or (isinstance(kind, list) and "array" in kind)


def _object_top(schema: dict[str, JSON]) -> dict[str, JSON]:
    """`type: object` with `properties` at the top; a top-level union's variants merged into them."""
    out = {k: v for k, v in schema.items() if k not in {*_TOP_LEVEL_UNIONS, "not", "enum", "const"}}
    properties = dict(out.get("properties") or {})
    required = list(out.get("required") or [])
    for key in _TOP_LEVEL_UNIONS:
        for variant in schema.get(key) or []:
            if isinstance(variant, Mapping):
                for name, prop in (variant.get("properties") or {}).items():
                    properties.setdefault(name, prop)
                if key == "allOf":  # every member applies, so its required names do too
                    required.extend(variant.get("required") or [])
    out["type"] = "object"
    out["properties"] = properties
    if required:
        out["required"] = list(dict.fromkeys(required))
    return out
