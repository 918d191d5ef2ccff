"""``python -m conductor_pipeline.benchmarks [NAME ...]`` — run benchmarks, merge into the JSON report."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from conductor_pipeline.benchmarks import (  # noqa: F401  (importing a suite registers it)
    REGISTRY,
    serving,
    suites,
    training,
)
from conductor_pipeline.paths import project_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (default: all of {sorted(REGISTRY)})"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="default: data/08_reporting/benchmarks.json"
    )
    args = parser.parse_args(argv)

    unknown = set(args.names) - set(REGISTRY)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; known: {sorted(REGISTRY)}")
    output = args.output or project_root() / "data" / "08_reporting" / "benchmarks.json"
    report = json.loads(output.read_text()) if output.is_file() else {}
    report.setdefault("results", {})
    failed = []
    for name in args.names or sorted(REGISTRY):
        print(f"[bench] {name} …", flush=True)
        start = time.perf_counter()
        try:
            figures = REGISTRY[name]()
        except Exception:  # a broken benchmark is reported, the others still run
            traceback.print_exc()
            failed.append(name)
            figures = {"error": traceback.format_exc(limit=3)}
        figures["wall_s"] = round(time.perf_counter() - start, 3)
        figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        report["results"][name] = figures
        print(json.dumps(figures, indent=2, default=str), flush=True)
    report["machine"] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str))
    print(f"[bench] wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
