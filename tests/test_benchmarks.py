"""`make bench` keeps working: the quick suites run through the module entry point and write
their figures into the JSON report (the figures themselves are not asserted: speed is
measured, never tested)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_quick_benchmarks_write_their_figures(tmp_path):
    output = tmp_path / "benchmarks.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "conductor_pipeline.benchmarks",
            "rewards",
            "executor",
            "--output",
            str(output),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = json.loads(output.read_text())["results"]
    rewards = results["rewards"]
    assert rewards["rollouts"] == 64 and rewards["worker_calls_per_pass"] == 96
    assert rewards["cold_cache_rollouts_per_s"] > 0 and rewards["warm_cache_rollouts_per_s"] > 0
    assert results["executor"]["overhead_per_step_ms"] > 0
