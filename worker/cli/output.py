"""How commands print: a table of rows on standard output, progress on standard error."""

from __future__ import annotations

import sys
from typing import Any


def progress(text: str) -> None:
    print(f"toolworker: {text}...", file=sys.stderr, flush=True)


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: min(48, max([len(c), *(len(str(r[c])) for r in rows)])) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_cell(str(row[c]), widths[c]) for c in columns))


def _cell(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"
