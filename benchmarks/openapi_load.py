"""Load time and memory of a large OpenAPI spec: the light index alone, and with every schema built.

    python -m benchmarks.openapi_load [--operations 1000] [--runs 7] [--format json|yaml]

Generates the spec in a temporary folder and measures each case in a fresh process (so one case's
allocations do not hide another's): the median wall time of several runs, the tracemalloc peak of one
run, and the growth of the resident set over one run. The reference is parsing the spec file alone
(`json.load`, or libyaml for YAML): the ratio says what the reader adds on top of reading the file.
Prints a table on stderr and the numbers as JSON on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.openapi_gen import generate_spec
from worker.definitions import catalog, file_store
from worker.definitions.readers.openapi import import_openapi

CASES = ("reference", "light", "schemas", "import")
DESCRIPTIONS = {
    "reference": "parse the spec file only",
    "light": "load: light index, no schema",
    "schemas": "load + build every schema",
    "import": "import_openapi (native document)",
}


def write_files(folder: Path, operations: int, fmt: str) -> Path:
    spec = generate_spec(operations)
    spec_file = folder / f"spec.{fmt}"
    if fmt == "json":
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
    else:
        spec_file.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    (folder / "tools.yaml").write_text(f"openapi:\n  - {{upstream: bench, spec: {spec_file.name}}}\n", encoding="utf-8")
    return spec_file


def case_function(case: str, spec_file: Path) -> Callable[[], Any]:
    definitions = spec_file.parent / "tools.yaml"

    def reference() -> Any:
        with spec_file.open(encoding="utf-8") as handle:
            if spec_file.suffix == ".json":
                return json.load(handle)
            return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))

    def light() -> Any:
        toolset = file_store.load([definitions], environ={})
        assert len(catalog.list_tools(toolset)) > 0
        return toolset

    def schemas() -> Any:
        toolset = file_store.load([definitions], environ={})
        for tool in toolset.tools.values():
            assert tool.input_schema["type"] == "object"
        return toolset

    def imported() -> Any:
        return import_openapi(spec_file, "bench", None, [])

    return {"reference": reference, "light": light, "schemas": schemas, "import": imported}[case]


def rss_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(case: str, spec_file: Path, runs: int) -> dict[str, Any]:
    """Run in a fresh process: resident-set growth first, then timings, then the tracemalloc peak."""
    run = case_function(case, spec_file)
    gc.collect()
    before = rss_bytes()
    kept = run()
    rss_delta = rss_bytes() - before
    del kept
    times = []
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    gc.collect()
    tracemalloc.start()
    run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "median_ms": round(statistics.median(times) * 1000, 2),
        "min_ms": round(min(times) * 1000, 2),
        "peak_mib": round(peak / 2**20, 2),
        "rss_delta_mib": round(rss_delta / 2**20, 2),
    }


def measure_in_child(case: str, spec_file: Path, runs: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.openapi_load", "--child", case, "--spec", str(spec_file)]
    output = subprocess.run([*command, "--runs", str(runs)], check=True, capture_output=True, text=True, timeout=600)
    result: dict[str, Any] = json.loads(output.stdout)
    return result


def print_table(results: dict[str, dict[str, Any]], stream: Any) -> None:
    reference = results["reference"]["median_ms"]
    print(f"{'case':<10} {'what':<34} {'median ms':>10} {'x ref':>7} {'peak MiB':>9} {'RSS +MiB':>9}", file=stream)
    for case, row in results.items():
        ratio = row["median_ms"] / reference
        print(
            f"{case:<10} {DESCRIPTIONS[case]:<34} {row['median_ms']:>10.1f} {ratio:>7.2f} "
            f"{row['peak_mib']:>9.1f} {row['rss_delta_mib']:>9.1f}",
            file=stream,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--operations", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--format", choices=("json", "yaml"), default="json")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.spec, args.runs)))
        return
    with tempfile.TemporaryDirectory() as folder:
        spec_file = write_files(Path(folder), args.operations, args.format)
        results = {case: measure_in_child(case, spec_file, args.runs) for case in CASES}
        size_mib = spec_file.stat().st_size / 2**20
    for row in results.values():
        row["x_reference"] = round(row["median_ms"] / results["reference"]["median_ms"], 2)
    print(f"{args.operations} operations, {args.format} spec of {size_mib:.1f} MiB, {args.runs} runs", file=sys.stderr)
    print_table(results, sys.stderr)
    summary = {"operations": args.operations, "format": args.format, "spec_mib": round(size_mib, 2), "cases": results}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
