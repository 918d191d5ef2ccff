"""Missing prerequisites of a run (a benchmark dataset, an API key, a GPU) as one clear
message naming the fix, instead of a traceback through Kedro's runner.

Nodes raise :class:`SetupError`; :class:`SetupErrorHooks` (registered in settings.py) turns
it into a short exit message once Kedro and kedro-mlflow have recorded the failed run.
"""

from __future__ import annotations

from kedro.framework.hooks import hook_impl

__all__ = ["SetupError", "SetupErrorHooks", "check_gpu", "find_setup_error", "missing_key_error"]


class SetupError(RuntimeError):
    """Something the run needs is not on this machine; ``fix`` says what to do."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}\nFix: {self.fix}"


def find_setup_error(error: BaseException | None) -> SetupError | None:
    """``error`` or the first :class:`SetupError` among its causes (Kedro may wrap it)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, SetupError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def check_gpu(needed_by: list[str], *, cuda_available: bool | None = None) -> None:
    """Raise when settings in ``needed_by`` (e.g. ``training.grpo.use_vllm``) need CUDA and
    there is no CUDA device."""
    if not needed_by:
        return
    if cuda_available is None:
        import torch

        cuda_available = bool(torch.cuda.is_available())
    if not cuda_available:
        raise SetupError(
            f"{', '.join(needed_by)} need a CUDA GPU, and this machine has none",
            "run `kedro run --env gpu` on a machine with an NVIDIA GPU (make gpu-check tests "
            "one), or run the CPU sandbox profile instead: `make run`",
        )


def missing_key_error(error: Exception) -> SetupError | None:
    """The worker configuration's "no API key" error (``workers/config.py``) as a
    :class:`SetupError`; None for any other configuration error."""
    message = str(error)
    if (
        "api_key_env" in message
        and "not set" in message
        or "credentials_key" in message
        and "not in the credentials" in message
    ):
        problem = message
    else:
        return None
    return SetupError(
        f"a worker's API key is missing: {problem}",
        "export that variable, or put the key in conf/local/credentials.yml (docs/sandbox.md, "
        "'Adding a real provider'); the CPU sandbox needs no key: `make run`",
    )


class SetupErrorHooks:
    """A run that failed on a :class:`SetupError` ends with its message (exit status 1)
    instead of the traceback; Kedro's runner has already logged which node failed."""

    # trylast: kedro-mlflow's on_pipeline_error (which closes the MLflow run as failed) first
    @hook_impl(trylast=True)
    def on_pipeline_error(self, error, run_params, pipeline, catalog) -> None:
        found = find_setup_error(error)
        if found is None:
            return
        raise SystemExit(f"\nCannot run: {found}") from None
