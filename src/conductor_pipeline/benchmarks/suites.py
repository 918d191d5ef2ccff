"""The benchmark suites; each function is registered under the name the report uses."""

from __future__ import annotations

from typing import Any

from conductor_pipeline.benchmarks import benchmark, timed, timings_summary


@benchmark("verifiers")
def verifier_throughput() -> dict[str, Any]:
    """Seconds to verify one answer, per verifier (code runs in the sandbox)."""
    from conductor_pipeline.tasks import Task, verify

    cases = {
        "math": (
            Task("b/m", "math", "easy", "1/2+1/4?", "\\frac{3}{4}", "math", "math", "bench"),
            "so \\boxed{3/4}",
        ),
        "multiple_choice": (
            Task(
                "b/c",
                "knowledge",
                "easy",
                "Pick one. A) x B) y",
                "B",
                "letter",
                "multiple_choice",
                "bench",
                {"choices": ["x", "y"]},
            ),
            "The answer is (B).",
        ),
        "numeric": (
            Task("b/n", "math", "easy", "2+2?", "4", "number", "numeric", "bench"),
            "It is 4.",
        ),
        "code": (
            Task(
                "b/code",
                "code",
                "easy",
                "Write add(a, b).",
                "def add(a, b):\n    return a + b\n",
                "code",
                "code",
                "bench",
                {
                    "prompt": "def add(a, b):\n",
                    "entry_point": "add",
                    "test": "def check(f):\n    assert f(1, 2) == 3\n",
                },
            ),
            "```python\ndef add(a, b):\n    return a + b\n```",
        ),
    }
    figures: dict[str, Any] = {}
    for name, (task, response) in cases.items():
        assert verify(task, response).correct, f"benchmark case {name} does not verify"
        figures[name] = timings_summary(
            timed(lambda t=task, r=response: verify(t, r), 5 if name == "code" else 50)
        )
    return figures
