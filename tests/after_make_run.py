"""Registers the trained adapter the tests keep (tests/fixtures/champion_adapter) in the project
at the working directory as `make run` leaves it: a `conductor` version in the project's own
MLflow store (mlruns/mlflow.db), logged by training's own `register_conductor`, with the
aliases promotion sets (`challenger`, `champion`). The adapter folder gets the
`conductor_info.json` training writes next to it, for this project's configuration (the
registered pyfunc model reads its prompt settings and worker list from it).

Run as a script in a project copy whose splits are prepared (tests/test_docs.py does); it
prints the version.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "champion_adapter"


def adapter_info(root: Path, adapter: Path) -> dict:
    """What training records for an adapter trained with this project's configuration."""
    from conductor_pipeline.project import load_project_config
    from conductor_pipeline.training.configs import SMOLLM2
    from conductor_pipeline.workers.sandbox.profiles import load_profiles, sandbox_pool_config
    from conductor_pipeline.workflow import shown_worker_descriptions
    from conductor_pipeline.workflow.config import prompt_config

    config = load_project_config(root=root)
    sandbox = config.worker_pool["sandbox"]
    entries = sandbox_pool_config(load_profiles(root / sandbox["profiles"]), "http://127.0.0.1")
    described = {entry["name"]: entry["description"] for entry in entries}
    names = list(sandbox.get("workers") or described)
    prompt = dict(config.parameters["conductor"]["prompt"])
    return {
        "adapter_dir": str(adapter),
        "base_model": SMOLLM2,
        "config_fingerprint": "make-run",
        "data_version": "make-run",
        "pool_fingerprint": "make-run",
        "run_fingerprint": "make-run",
        "global_step": 14,
        "worker_names": names,
        "conductor_descriptions": shown_worker_descriptions(
            [described[name] for name in names], prompt_config(prompt)
        ),
        "prompt": prompt,
    }


def register_champion(root: Path) -> str:
    import mlflow

    from conductor_pipeline.pipelines.training.nodes import register_conductor
    from conductor_pipeline.training.artifacts import ADAPTER_INFO_FILE

    adapter = root / "data" / "06_models" / "conductor" / "adapter"
    shutil.copytree(FIXTURE, adapter, ignore=shutil.ignore_patterns("README.md"))
    info = adapter_info(root, adapter)
    (adapter / ADAPTER_INFO_FILE).write_text(json.dumps(info, indent=2))
    mlflow.set_experiment("conductor")  # kedro-mlflow's experiment (conf/base/mlflow.yml)
    record = register_conductor(info)
    client = mlflow.MlflowClient()
    for alias in ("challenger", "champion"):
        client.set_registered_model_alias(record["name"], alias, record["version"])
    return record["version"]


if __name__ == "__main__":
    print(register_champion(Path.cwd()))
