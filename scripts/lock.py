"""The dependency locks: which pyproject.toml they were made from, and whether it has changed since.

`make lock` resolves requirements.lock (the runtime dependencies: the image) and requirements-dev.lock
(with the dev and docs extras: `make install`) with uv, then stamps both with a fingerprint of
pyproject.toml's dependency lists; `make install` runs `check` to say when the lock is behind.

    python scripts/lock.py stamp FILE...   append the fingerprint line to each lock
    python scripts/lock.py check FILE...   exit 1, saying what to do, when a lock's fingerprint differs
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "# pyproject.toml dependencies: sha256="


def fingerprint(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """A digest of what a resolution reads from pyproject.toml: requires-python and the dependency lists."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    inputs = {key: project.get(key) for key in ("requires-python", "dependencies", "optional-dependencies")}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def stamped(lock: Path) -> str | None:
    """The fingerprint a lock was stamped with, if any."""
    for line in lock.read_text(encoding="utf-8").splitlines():
        if line.startswith(PREFIX):
            return line.removeprefix(PREFIX).strip()
    return None


def stamp(lock: Path) -> None:
    lines = [line for line in lock.read_text(encoding="utf-8").splitlines() if not line.startswith(PREFIX)]
    lock.write_text("\n".join([PREFIX + fingerprint(), *lines]) + "\n", encoding="utf-8")


def problems(locks: list[Path], pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Why each lock cannot be used as it is (missing, or made from other dependency lists)."""
    current = fingerprint(pyproject)
    found = []
    for lock in locks:
        if not lock.exists():
            found.append(f"{lock.name} is missing")
        elif stamped(lock) != current:
            found.append(f"{lock.name} was made from other dependencies than pyproject.toml lists now")
    return found


def main(argv: list[str]) -> int:
    command, locks = argv[0], [Path(name) for name in argv[1:]]
    if command == "stamp":
        for lock in locks:
            stamp(lock)
        return 0
    found = problems(locks)
    for problem in found:
        print(f"*** {problem}: run `make lock` and commit the locks.", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
