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

# instruction-set extensions that change how fast a small model runs on the CPU: two 2-core
# machines, one with AMX (bfloat16 matrix tiles) and one with AVX2 only, differ severalfold
_MATRIX_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, object]:
    """The CPU's model name and which of ``_MATRIX_EXTENSIONS`` it has (empty where
    ``cpuinfo`` cannot be read: not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {"cpu_model": platform.processor() or None, "cpu_extensions": []}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name"),
        "cpu_extensions": [name for name in _MATRIX_EXTENSIONS if name in flags],
    }


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
        **cpu_description(),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str))
    print(f"[bench] wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
