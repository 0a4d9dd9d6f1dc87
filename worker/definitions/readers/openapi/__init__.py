"""OpenAPI 3.x and Swagger 2.0 specs (docs/guides/definitions.md): one tool per operation.

Two entry points share everything here: `openapi:` entries of native files (`read_entries`; each
input schema is built on first use) and `import_openapi` (a native document with every schema built).

How an operation becomes a tool:
- name: `operationId` sanitised to the tool-name rule, else method and path; `_2`, `_3`… keep it unique.
- arguments: path, query and header parameters, each under its name made safe for every consumer
  (`^[A-Za-z0-9_.-]{1,64}$`: `filter[name]` -> `filter_name`; the template keeps the wire name). A name
  met again in another location becomes `<location>_<name>`. Cookie parameters are not mapped, and
  header parameters named Accept, Content-Type or Authorization are ignored, as OpenAPI says.
- JSON body: an object's properties become top-level arguments when none collides with a parameter
  (read-only ones are left out); each is placed by an explicit body template, so it lands in the body
  whatever the method, and an absent one is left out. Otherwise, and for bodies that are not objects,
  the whole body is one `body` argument. Form bodies with properties are always flattened (a colliding
  field becomes `body_<name>`); text and XML bodies are one string `body` argument. A required body of
  another media type (multipart, octet-stream) makes the tool unusable; an optional one is not sent.
- `$ref`: within the spec and into files beside it. A ref met again inside its own expansion (a cycle),
  nested deeper than MAX_REF_DEPTH, or past MAX_REF_EXPANSIONS in one schema, becomes a permissive
  schema that says so in its description: recursive schemas load, never loop.
- schemas: OpenAPI's dialect becomes JSON Schema 2020-12 (`nullable`, boolean `exclusiveMinimum`,
  `example`, `type: file`); keywords outside JSON Schema (`discriminator`, `xml`, `x-*`) are dropped,
  and so are values that would make the schema invalid (a `pattern` Python cannot compile).
- laziness: only what the request templates need (parameters' names and locations, the body's
  property names) is read at load; `Tool.schema` is a factory that builds the input schema.

    refs.py        `$ref` resolution, within the spec and into files beside it
    schemas.py     schema building: OpenAPI's dialect to JSON Schema 2020-12
    operations.py  the spec walker: operations and their arguments (the light index)
    tools.py       an operation as a tool, or as a native `tools:` entry
    importer.py    `import_openapi`: a spec as a native document
    entries.py     `openapi:` entries of native files, and specs met in a definitions folder
"""

from __future__ import annotations

from worker.definitions.readers.openapi.entries import SpecFileReader, read_entries
from worker.definitions.readers.openapi.importer import import_openapi
from worker.definitions.readers.openapi.operations import JSON_TYPE, SpecError, argument_name, tool_name

__all__ = ["JSON_TYPE", "SpecError", "SpecFileReader", "argument_name", "import_openapi", "read_entries", "tool_name"]
