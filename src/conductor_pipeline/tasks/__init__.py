"""Task suites, answer verifiers and the code sandbox."""

from conductor_pipeline.tasks.code_sandbox import SandboxResult, run_python
from conductor_pipeline.tasks.types import Task
from conductor_pipeline.tasks.verifiers import Verdict, verify

__all__ = [
    "SandboxResult",
    "Task",
    "Verdict",
    "run_python",
    "verify",
]
