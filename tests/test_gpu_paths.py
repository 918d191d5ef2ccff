"""The GPU profile keeps its data and its registered model apart from the sandbox's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conductor_pipeline import registry
from conductor_pipeline.project import load_project_config
from conductor_pipeline.settings import CONFIG_LOADER_ARGS, CONFIG_LOADER_CLASS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    for variable in ("GEMINI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "VLLM_API_KEY"):
        monkeypatch.setenv(variable, "dummy")
    yield
    registry.use_registered_model(None)


def _loader(env: str):
    return CONFIG_LOADER_CLASS(conf_source=str(REPO / "conf"), env=env, **CONFIG_LOADER_ARGS)


def _catalog_paths(env: str) -> dict[str, str]:
    paths = {}
    for name, entry in _loader(env)["catalog"].items():
        entry = entry.get("dataset", entry) if isinstance(entry, dict) else {}
        if isinstance(entry, dict) and "filepath" in entry:
            paths[name] = entry["filepath"]
    return paths


def _data_strings(value: Any, where: str = "") -> dict[str, str]:
    """Every string under ``value`` that names something in a data tree."""
    if isinstance(value, dict):
        return {
            k: v
            for key, item in value.items()
            for k, v in _data_strings(item, f"{where}.{key}").items()
        }
    if isinstance(value, list):
        return {
            k: v
            for i, item in enumerate(value)
            for k, v in _data_strings(item, f"{where}[{i}]").items()
        }
    if isinstance(value, str) and value.startswith("data/"):
        return {where: value}
    return {}


def test_every_dataset_of_the_gpu_profile_lies_in_its_own_tree():
    base, gpu = _catalog_paths("base"), _catalog_paths("gpu")
    assert base.keys() == gpu.keys() and "{split}_tasks" in gpu
    for name, path in gpu.items():
        assert path.startswith("data/gpu/"), (name, path)
        assert not base[name].startswith("data/gpu/") and base[name] != path, name
    assert gpu["{split}_tasks"] == "data/gpu/05_model_input/{split}_tasks.parquet"


def test_everything_the_gpu_profile_writes_or_reads_is_under_data_gpu():
    """Splits, response cache, usage log, adapters, evaluation store, reports, retraining
    inputs and served traffic: no path of the GPU profile is one of the sandbox's."""
    gpu = load_project_config("gpu", root=REPO)
    base = load_project_config("base", root=REPO)
    assert (gpu.data_root, base.data_root) == ("data/gpu", "data")
    found = _data_strings(gpu.parameters) | _data_strings(gpu.worker_pool, "worker_pool")
    for where in (
        ".training.output_dir",
        ".evaluation.store",
        ".reporting.output_dir",
        ".serving.capture.path",
        ".retraining.lock.path",
        ".retraining_sources.traffic.path",
        "worker_pool.cache.path",
        "worker_pool.usage_log",
    ):
        assert where in found, where
    outside = {k: v for k, v in found.items() if not v.startswith("data/gpu/")}
    assert not outside, outside
    sandbox = _data_strings(base.parameters) | _data_strings(base.worker_pool, "worker_pool")
    assert not set(found.values()) & set(sandbox.values())


def test_the_gpu_profile_has_its_own_registered_model_everywhere():
    gpu = load_project_config("gpu", root=REPO)
    base = load_project_config("base", root=REPO)
    assert base.registered_model == "conductor"
    assert gpu.registered_model == "conductor-qwen"
    for config in (gpu, base):
        name = config.registered_model
        params = config.parameters
        assert params["conductor"]["policy"]["adapter"] == f"models:/{name}@champion"
        assert params["retraining"]["start_from"] == f"models:/{name}@champion"
    watermarks = gpu.parameters["retraining_sources"]["watermarks"]["experiment"]
    assert watermarks != base.parameters["retraining_sources"]["watermarks"]["experiment"]


@pytest.mark.parametrize(("env", "name"), [("gpu", "conductor-qwen"), ("base", "conductor")])
def test_a_kedro_run_trains_evaluates_and_promotes_the_profiles_model(env, name, tmp_path):
    """The project hook sets the process's registered model from the run's environment;
    registration, evaluation's champion, promotion and run names all read it."""
    from conductor_pipeline import promotion
    from conductor_pipeline.hooks import ProjectHooks

    registry.use_registered_model("something-else")
    ProjectHooks().after_context_created(SimpleNamespace(config_loader=_loader(env)))
    assert registry.registered_model() == name

    class Client:
        def __init__(self) -> None:
            self.asked: list[str] = []

        def get_model_version_by_alias(self, model: str, alias: str):
            self.asked.append(model)
            return SimpleNamespace(version="2")

    client = Client()
    promotion_client = promotion._client
    promotion._client = lambda: client  # type: ignore[assignment]
    try:
        assert promotion.current_versions() == {"champion": "2", "challenger": "2"}
    finally:
        promotion._client = promotion_client  # type: ignore[assignment]
    assert set(client.asked) == {name}
    from datetime import UTC, datetime

    label = registry.run_name(["training"], datetime(2026, 1, 1, tzinfo=UTC), version="3")
    assert label.endswith(f"→ {name} v3")


def test_a_registered_model_name_must_read_as_a_reference():
    with pytest.raises(ValueError, match="globals.yml"):
        registry.use_registered_model("conductor qwen")


def test_conductor_promote_rolls_back_the_profiles_own_model(monkeypatch, capsys):
    """`conductor promote --rollback --env gpu` moves conductor-qwen's champion, not the
    sandbox's."""
    from argparse import Namespace

    from conductor_pipeline import commands, promotion

    asked: list[str] = []

    monkeypatch.setattr(promotion, "_alias_version", lambda client, alias, name: asked.append(name))
    monkeypatch.setattr(promotion, "_client", lambda: object())  # no MLflow store needed
    assert commands.cmd_promote(Namespace(rollback=True, env="gpu")) == 1
    assert asked == ["conductor-qwen"]
    assert "conductor-qwen has no champion" in capsys.readouterr().err


def test_ask_sample_draws_from_the_profiles_own_split(tmp_path):
    import pandas as pd

    from conductor_pipeline.commands import pick_sample_question
    from conductor_pipeline.project import load_project_config

    gpu = load_project_config("gpu", root=REPO)
    assert gpu.data_dir == REPO / "data" / "gpu"  # what `conductor ask --env gpu --sample` reads
    split = tmp_path / "data" / "gpu" / "05_model_input"
    split.mkdir(parents=True)
    pd.DataFrame({"question": ["a GPU-profile question"]}).to_parquet(split / "test_tasks.parquet")
    assert pick_sample_question(tmp_path / "data" / "gpu", 0) == "a GPU-profile question"
    with pytest.raises(SystemExit, match="data/05_model_input"):
        pick_sample_question(tmp_path / "data", 0)
