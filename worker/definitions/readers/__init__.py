"""Definition formats: one reader per format, each turning a parsed file into the same `ToolSet`.

A reader is asked, in order, whether it accepts a document; the first that does reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.definitions.model import ToolSet
from worker.definitions.readers.document import DefinitionSyntaxError, Document, Reader, StrictModel, parse_file
from worker.definitions.readers.kind_http import KindHttpReader
from worker.definitions.readers.native import NativeReader
from worker.definitions.readers.openapi import SpecFileReader
from worker.definitions.readers.toolbox import ToolboxReader

__all__ = ["DefinitionSyntaxError", "Document", "StrictModel", "parse_file", "read_document", "readers"]


def readers() -> Sequence[Reader]:
    """Every known format, most specific first."""
    # A bare OpenAPI spec beside the definitions is read through an `openapi:` entry, not on its own.
    return [NativeReader(), KindHttpReader(), SpecFileReader(), ToolboxReader()]


def read_document(doc: Document) -> ToolSet:
    for reader in readers():
        if reader.accepts(doc):
            return reader.read(doc)
    formats = ", ".join(r.name for r in readers())
    return ToolSet(problems=[doc.problem(f"not a definitions file of a known format ({formats})")])
