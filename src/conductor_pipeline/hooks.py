"""Project hooks: make sure the tracking store's directory exists before kedro-mlflow opens it."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl

from conductor_pipeline.paths import project_root


class ProjectHooks:
    # tryfirst: plugin hooks (kedro-mlflow) are registered later and would run first otherwise
    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        (project_root() / "mlruns").mkdir(parents=True, exist_ok=True)
