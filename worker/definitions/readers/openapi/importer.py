"""`toolworker import-openapi`: a spec's operations as a native definitions document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worker.definitions.model import Problem
from worker.definitions.readers.openapi.operations import Spec, SpecError
from worker.definitions.readers.openapi.tools import tool_definition
from worker.definitions.readers.security import auth_skeleton
from worker.definitions.templates import escape


def import_openapi(
    spec_path: Path,
    upstream: str,
    base_url: str | None,
    tags: list[str],
    *,
    problems: list[Problem] | None = None,
) -> dict[str, Any]:
    """A native definitions document (`upstreams:` and `tools:`) for a spec's operations.

    `base_url` (a template: `${env:NAME}` allowed) replaces the spec's servers; `tags` keeps only the
    operations with one of them. Operations that cannot be mapped are left out, each with a problem
    appended to `problems` when given. Raises SpecError when the spec cannot be used at all.
    """
    spec = Spec.load(spec_path)
    url = base_url or spec.server_url()
    if not url:
        raise SpecError(spec.doc.problem("the spec names no absolute server URL: give a base URL"))
    operations, found = spec.operations(include_tags=tags)
    found += [
        spec.doc.problem(f"{op.method} {op.path} left out: {op.unusable}", "paths", op.path)
        for op in operations
        if op.unusable
    ]
    if problems is not None:
        problems.extend(found)
    entry: dict[str, Any] = {"base_url": base_url or escape(url)}
    auth = auth_skeleton(spec.doc.data, upstream)
    if auth is not None:
        entry["auth"] = auth
    return {
        "upstreams": {upstream: entry},
        "tools": [tool_definition(op, upstream, spec) for op in operations if not op.unusable],
    }
