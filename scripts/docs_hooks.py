"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages' parts written from the code at build time.

A page asks for a part with an HTML comment on a line of its own, replaced when the site is built:

    <!-- generated: settings -->   settings of worker/settings.py the page's table does not list yet
    <!-- generated: cli -->        every `toolworker` command's --help
    <!-- generated: openapi -->    the gateway's REST operations, from worker/gateway/rest/document.py

The OpenAPI document itself is also published beside the page, as reference/openapi.json.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
OPENAPI_PATH = "reference/openapi.json"
SERVER_URL = "http://127.0.0.1:8780"
MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.MULTILINE)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, OPENAPI_PATH, content=json.dumps(openapi(), indent=2) + "\n"))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return MARKER.sub(lambda match: PARTS[match.group(1)](markdown), markdown)


# Settings


def setting_comments() -> dict[str, str]:
    """The comment lines above each field of the Settings class, by field name: the house documents them there."""
    source = (ROOT / "worker" / "settings.py").read_text(encoding="utf-8")
    lines = source.splitlines()
    [settings] = [node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Settings"]
    comments = {}
    for node in settings.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#"):
                above.insert(0, lines[row].strip().lstrip("# "))
                row -= 1
            comments[node.target.id] = " ".join(above)
    return comments


def default_text(field: Any) -> str:
    value = field.default
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if value in ("", None):
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def undocumented_settings(markdown: str) -> str:
    """A table of the settings the page does not list, with their defaults and the code's comments."""
    from worker.settings import Settings

    listed = set(re.findall(r"^\| `TOOLWORKER_([A-Z0-9_]+)`", markdown, re.MULTILINE))
    comments = setting_comments()
    rows = [
        f"| `TOOLWORKER_{name.upper()}` | {default_text(field)} | {cell(comments.get(name, ''))} |"
        for name, field in Settings.model_fields.items()
        if name.upper() not in listed
    ]
    if not rows:
        return ""
    intro = "Settings this table does not describe yet, with the comment of `worker/settings.py`:"
    return "\n".join([intro, "", "| variable | default | meaning |", "|---|---|---|", *rows])


# The command line


def commands() -> dict[str, argparse.ArgumentParser]:
    """The `toolworker` parser and its subcommands' parsers, by name ("" for the top)."""
    from worker.cli import parser

    top = parser()
    found = {"": top}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def help_text(parser: argparse.ArgumentParser) -> str:
    """A parser's --help at 110 columns: argparse wraps to the terminal's width, which differs by machine."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"
    try:
        out = io.StringIO()
        with redirect_stdout(out):
            parser.print_help()
        return out.getvalue().rstrip()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def cli_reference(markdown: str) -> str:
    parts = []
    for name, parser in commands().items():
        parts += [f"## toolworker {name}".strip(), "", "```text", help_text(parser), "```", ""]
    return "\n".join(parts)


# REST


def openapi() -> dict[str, Any]:
    from worker.gateway import version
    from worker.gateway.rest import document as openapi_document

    document: dict[str, Any] = openapi_document.document(SERVER_URL, version())
    return document


def inputs(operation: dict[str, Any]) -> str:
    """An operation's parameters (`name` (in)) and request body (the schema it names), for a table cell."""
    found = [f"`{p['name']}` ({p['in']})" for p in operation.get("parameters", [])]
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if "$ref" in body:
        name = body["$ref"].rsplit("/", 1)[-1]
        found.append(f"body: [{name}](#{name.lower()})")
    return ", ".join(found) or "—"


def rest_reference(markdown: str) -> str:
    document = openapi()
    rows = ["| route | operation | what | takes | answers |", "|---|---|---|---|---|"]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            codes = ", ".join(sorted(operation["responses"]))
            route = f"`{method.upper()} {path}`"
            what = f"`{operation['operationId']}`"
            rows.append(f"| {route} | {what} | {operation['summary']} | {inputs(operation)} | {codes} |")
    schemas = []
    for name, schema in document["components"]["schemas"].items():
        schemas += [f"### {name}", "", "```json", json.dumps(schema, indent=2), "```", ""]
    return "\n".join(
        [
            f"OpenAPI {document['openapi']}, version {document['info']['version']}: "
            f"[the whole document](openapi.json) (the gateway serves it at `/v1/openapi.json`).",
            "",
            *rows,
            "",
            "## Schemas",
            "",
            *schemas,
        ]
    )


PARTS: dict[str, Callable[[str], str]] = {
    "settings": undocumented_settings,
    "cli": cli_reference,
    "openapi": rest_reference,
}
