"""The dependency locks (docs/contributing.md, "Dependencies and the lock"): made from pyproject.toml as it is,
exact versions with hashes, the same versions in both, and what the Makefile and the image install."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts.lock import fingerprint, problems, stamped

ROOT = Path(__file__).parent.parent
LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)


def pins(lock: Path) -> dict[str, str]:
    return {canonicalize_name(name): version for name, version in PIN.findall(lock.read_text(encoding="utf-8"))}


def entries(lock: Path) -> list[str]:
    """Each requirement of a lock with its continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", lock.read_text(encoding="utf-8"))
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def project() -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return data


def test_locks_are_made_from_pyproject_as_it_is() -> None:
    """Both locks carry the fingerprint of pyproject.toml's dependency lists: otherwise run `make lock`."""
    assert problems([LOCK, DEV_LOCK]) == [], "run `make lock` and commit both locks"
    assert stamped(LOCK) == stamped(DEV_LOCK) == fingerprint()


@pytest.mark.integration
def test_a_changed_dependency_makes_the_locks_stale(tmp_path: Path) -> None:
    """A dependency added to pyproject.toml after the lock was made is noticed, naming `make lock`; stamping
    the lock again (what `make lock` ends with) settles it."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lock.py", tmp_path / "scripts" / "lock.py")
    shutil.copy(LOCK, tmp_path / LOCK.name)
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    changed = text.replace("dependencies = [\n", 'dependencies = [\n    "standardwebhooks>=1.0",\n', 1)
    assert changed != text
    (tmp_path / "pyproject.toml").write_text(changed, encoding="utf-8")
    assert fingerprint(tmp_path / "pyproject.toml") != fingerprint()

    def lock_py(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "scripts/lock.py", *argv, LOCK.name]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    stale = lock_py("check")
    assert stale.returncode == 1
    assert "requirements.lock was made from other dependencies" in stale.stderr and "make lock" in stale.stderr
    assert lock_py("stamp").returncode == 0
    assert (lock_py("check").returncode, lock_py("check").stderr) == (0, "")


def test_every_requirement_is_pinned_with_hashes() -> None:
    """Every entry of both locks is an exact version with at least one sha256 hash."""
    for lock in (LOCK, DEV_LOCK):
        for entry in entries(lock):
            assert PIN.match(entry), f"{lock.name}: not an exact pin: {entry[:80]}"
            assert "--hash=sha256:" in entry, f"{lock.name}: no hash: {entry[:80]}"


def test_locks_hold_what_pyproject_asks_for() -> None:
    """The runtime lock pins every dependency; the dev lock also every dev and docs one, within their bounds."""
    extras = project()["optional-dependencies"]
    assert isinstance(extras, dict) and {"dev", "docs"} <= set(extras)
    runtime = [Requirement(line) for line in project()["dependencies"]]  # type: ignore[attr-defined]
    dev = runtime + [Requirement(line) for line in extras["dev"] + extras["docs"]]
    for lock, requirements in ((LOCK, runtime), (DEV_LOCK, dev)):
        pinned = pins(lock)
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{lock.name} lacks {name}"
            assert requirement.specifier.contains(pinned[name], prereleases=True), (lock.name, name, pinned[name])
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "uv"} <= set(pins(DEV_LOCK))


def test_dev_lock_keeps_the_runtime_versions() -> None:
    """A package in both locks has the same version in both: tests run what the image ships."""
    runtime, dev = pins(LOCK), pins(DEV_LOCK)
    assert set(runtime) <= set(dev)
    assert {name: (version, dev[name]) for name, version in runtime.items() if dev[name] != version} == {}


def test_installs_use_the_locks_with_hashes() -> None:
    """`make install` installs the dev lock and the image the runtime lock, both with --require-hashes."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    install = makefile[makefile.index("$(STAMP):") :].split("\n\n", 1)[0]
    assert "--require-hashes -r $(DEV_LOCK)" in install and "--no-deps -e ." in install
    assert "scripts/lock.py check" in install
    dockerfile = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    assert re.search(r"pip install [^\n]*--require-hashes -r /tmp/requirements\.lock", dockerfile)
    assert re.search(r"pip install [^\n]*--no-deps /wheels/", dockerfile)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in ci and re.search(r"^test: install\b", makefile, re.MULTILINE)
