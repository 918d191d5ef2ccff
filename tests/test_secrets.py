"""Secrets from credentials.yml or the environment never reach usage records, logs, MLflow
params, tags, metrics, artifacts or traces. A canary key is planted and everything is searched."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.runtime import open_worker_pool
from conductor_pipeline.workers.sandbox import SandboxServer

REPO = Path(__file__).resolve().parents[1]
CANARY_FILE = "sk-canary-from-credentials-7f3a9c"
CANARY_ENV = "sk-canary-from-environment-2b8e1d"


def _leaks_in(folder: Path) -> list[str]:
    """Files under ``folder`` (text or binary, SQLite included) that contain a canary."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            if CANARY_FILE.encode() in data or CANARY_ENV.encode() in data:
                found.append(str(path))
    return found


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "project"
    (root / "conf" / "local").mkdir(parents=True)
    (root / "src").mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf" / "base", root / "conf" / "base")
    (root / "conf" / "local" / "credentials.yml").write_text(
        yaml.safe_dump({"canary_provider": CANARY_FILE})
    )
    small = {
        "data_prep": {
            "seed": 1,
            "sources": {
                "reasoning_gym": {
                    "datasets": {
                        "basic_arithmetic": {"count": 8, "domain": "math", "difficulty": "easy"}
                    }
                }
            },
            "domain_quota": {"math": 8},
            "split_ratios": {"train": 0.5, "validation": 0.25, "test": 0.25},
        }
    }
    (root / "conf" / "local" / "parameters_data_prep.yml").write_text(yaml.safe_dump(small))
    monkeypatch.setenv("CANARY_ENV_KEY", CANARY_ENV)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(root)
    return root


def test_canary_keys_leak_nowhere(project, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from conductor_pipeline.tracing import log_orchestration_trace
    from conductor_pipeline.workflow import PolicyCompletion, orchestrate

    # a Kedro run with the credentials present: kedro-mlflow logs every parameter
    bootstrap_project(project)
    with KedroSession.create(project_path=project) as session:
        session.run(pipeline_names=["data_prep"])

    # a pool whose workers authenticate with both canaries, against the real sandbox server
    task = Task(
        "t/add",
        "math",
        "easy",
        "Compute the sum of 1234 and 4321.",
        "5555",
        "number",
        "numeric",
        "unit",
    )
    tasks_path = project / "tasks.parquet"
    pd.DataFrame([task.to_record()]).to_parquet(tasks_path)
    with SandboxServer(
        tasks_paths=[tasks_path], latency_scale=0.0, load_real_model=False
    ) as server:
        entries = [e for e in server.pool_config() if e["name"] in ("sim-sage", "sim-sprout")]
        entries[0]["credentials_key"] = "canary_provider"
        entries[1]["api_key_env"] = "CANARY_ENV_KEY"
        config = {
            "kind": "configured",
            "workers": entries,
            "usage_log": "usage.jsonl",
            "cache": {"path": "cache.sqlite"},
        }
        credentials = yaml.safe_load((project / "conf/local/credentials.yml").read_text())

        class Policy:
            name = "scripted"

            async def complete(self, messages, *, temperature, max_tokens, seed):
                text = "model_id = [0, 1]\nsubtasks = ['Compute the sum of 1234 and 4321.', 'check']\naccess_list = [[], \"all\"]"
                return PolicyCompletion(text, 10, 10, 0.0)

        with open_worker_pool(config, credentials, root=project) as pool:
            result = asyncio.run(
                orchestrate(
                    task.question, Policy(), pool, pool.descriptions, worker_names=pool.names
                )
            )
            repr(pool), [repr(spec) for spec in pool.specs]
            records = [str(r) for r in pool.usage_log]
        import mlflow

        mlflow.set_tracking_uri(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
        log_orchestration_trace(result)
        mlflow.flush_trace_async_logging()
        server_log = server.last_log

    assert result.answer
    everything = "\n".join(
        [*records, str(result.to_dict()), server_log, caplog.text, *capfd.readouterr()]
    )
    assert CANARY_FILE not in everything and CANARY_ENV not in everything
    with sqlite3.connect(project / "mlruns" / "mlflow.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM params").fetchone()[0] > 0  # params were logged
    assert _leaks_in(project / "mlruns") == []
    assert _leaks_in(project / "data") == []
    assert (project / "usage.jsonl").is_file() and _leaks_in(project) == [
        str(project / "conf/local/credentials.yml")
    ]
