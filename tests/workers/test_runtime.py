"""open_worker_pool: configuration errors, and a real sandbox server reached through the pool."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.runtime import open_worker_pool

REPO = Path(__file__).resolve().parents[2]

TASKS = [
    Task(
        "t/add",
        "math",
        "easy",
        "Compute the sum of 1234 and 4321 and give the number.",
        "5555",
        "number",
        "numeric",
        "unit",
    ),
    Task(
        "t/syl",
        "logic",
        "easy",
        "All cats are mammals and all mammals breathe air. Do cats breathe air? Answer Yes or No.",
        "Yes",
        "text",
        "exact",
        "unit",
    ),
]


def sandbox_config(tasks_path: Path, **overrides) -> dict:
    config = {
        "kind": "sandbox",
        "cache": {"path": "cache.sqlite", "mode": "read_write"},
        "sandbox": {
            "profiles": str(REPO / "conf/base/sandbox_workers.yml"),
            "workers": ["sim-sage", "sim-abacus", "sim-sprout"],
            "latency_scale": 0.0,
            "load_real_model": False,
            "tasks": [str(tasks_path)],
        },
    }
    config.update(overrides)
    return config


@pytest.fixture
def tasks_path(tmp_path) -> Path:
    path = tmp_path / "tasks.parquet"
    pd.DataFrame([t.to_record() for t in TASKS]).to_parquet(path)
    return path


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"kind": "magic"}, "worker_pool.kind"),
        (
            {"kind": "sandbox", "sandbx": {}},
            r"worker_pool: unknown key 'sandbx' \(did you mean 'sandbox'\?\)",
        ),
        ({"kind": "sandbox", "cache": {"mode": "sometimes"}}, "worker_pool.cache.mode"),
        (
            {"kind": "sandbox", "sandbox": {"latency": 1}},
            "worker_pool.sandbox: unknown key 'latency'",
        ),
        ({"kind": "configured", "workers": []}, "worker_pool.workers"),
    ],
)
def test_malformed_pool_config_names_the_key(config, message, tmp_path):
    with pytest.raises(ValueError, match=message), open_worker_pool(config, root=tmp_path):
        pass


def test_missing_task_files_say_to_prepare_data(tmp_path):
    config = sandbox_config(tmp_path / "absent.parquet")
    with (
        pytest.raises(FileNotFoundError, match="make run"),
        open_worker_pool(config, root=tmp_path),
    ):
        pass


def test_real_model_concurrency_below_one_is_refused_by_name(tasks_path, tmp_path):
    config = sandbox_config(tasks_path)
    config["sandbox"]["real_model_concurrency"] = 0
    with (
        pytest.raises(ValueError, match="worker_pool.sandbox.real_model_concurrency"),
        open_worker_pool(config, root=tmp_path),
    ):
        pass


def test_the_sandbox_server_runs_the_configured_real_model_concurrency(tasks_path):
    import httpx

    from conductor_pipeline.workers.sandbox.server import SandboxServer

    with SandboxServer(
        tasks_paths=[tasks_path], load_real_model=False, real_model_concurrency=2
    ) as server:
        health = httpx.get(f"{server.url}/health", timeout=30).json()
    assert health["real_model_concurrency"] == 2


def test_unknown_sandbox_worker_is_named(tasks_path, tmp_path):
    config = sandbox_config(tasks_path)
    config["sandbox"]["workers"] = ["sim-sage", "sim-nobody"]
    with pytest.raises(ValueError, match="sim-nobody"), open_worker_pool(config, root=tmp_path):
        pass


def test_sandbox_pool_answers_every_worker_through_litellm_and_caches(tasks_path, tmp_path):
    messages = [{"role": "user", "content": TASKS[0].question}]

    async def ask_all(pool):
        return await asyncio.gather(*(pool(i, messages) for i in range(len(pool))))

    with open_worker_pool(sandbox_config(tasks_path), root=tmp_path) as pool:
        assert pool.names == ["sim-sage", "sim-abacus", "sim-sprout"]
        assert all(pool.descriptions)
        first = asyncio.run(ask_all(pool))
        again = asyncio.run(ask_all(pool))
        other_sample = asyncio.run(pool(0, messages, sample_index=1))
    assert all(reply.ok and reply.text for reply in first)
    assert all(reply.usage.prompt_tokens > 0 and reply.usage.cost_usd > 0 for reply in first)
    assert [r.text for r in again] == [r.text for r in first]
    assert all(r.usage.cache_hit for r in again)
    assert not other_sample.usage.cache_hit
    assert (tmp_path / "cache.sqlite").is_file()


def test_injected_faults_are_typed_failures_not_answers(tasks_path, tmp_path):
    messages = [{"role": "user", "content": TASKS[1].question}]

    async def many(pool):
        return await asyncio.gather(*(pool(i % 3, messages, sample_index=i) for i in range(60)))

    with open_worker_pool(
        sandbox_config(tasks_path, cache={"mode": "off"}),
        root=tmp_path,
        fault_rates={"timeout": 0.2, "empty_reply": 0.1},
    ) as pool:
        replies = asyncio.run(many(pool))
        stats = pool.injector.stats
    failures = [r for r in replies if not r.ok]
    assert len(failures) == sum(stats["injected"].values()) > 0
    assert {r.failure.value for r in failures} <= {"timeout", "empty_reply"}
    assert all(r.text is None for r in failures)


@pytest.mark.slow
def test_real_smollm2_worker_generates_through_the_pool(tasks_path, tmp_path):
    config = sandbox_config(tasks_path)
    config["sandbox"].update(load_real_model=True, workers=["smollm2-135m", "sim-sage"])
    messages = [{"role": "user", "content": "Name one colour of the sky."}]
    with open_worker_pool(config, root=tmp_path) as pool:
        # the pool is handed out while the model may still load: the call waits for it
        reply = asyncio.run(pool("smollm2-135m", messages))
        health = httpx.get(pool.question_check.url + "/health", timeout=5)
        assert health.json()["real_model_loaded"] is True
    assert reply.ok, reply.error
    assert reply.text.strip()
    assert reply.usage.completion_tokens > 0 and reply.usage.cost_usd > 0


@pytest.fixture
def unloadable_model(tmp_path, monkeypatch) -> None:
    """The sandbox's real model cannot load: its cache folder's parent is a file."""
    not_a_folder = tmp_path / "models"
    not_a_folder.write_text("a file where the model cache's parent folder should be")
    monkeypatch.setenv("CONDUCTOR_MODEL_CACHE", str(not_a_folder / "smollm2"))


@pytest.mark.usefixtures("unloadable_model")
def test_a_real_model_that_fails_to_load_is_logged_once_and_the_simulated_workers_answer(
    tasks_path, tmp_path, caplog
):
    config = sandbox_config(tasks_path, cache={"mode": "off"})
    config["sandbox"].update(load_real_model=True, workers=["smollm2-135m", "sim-sage"])
    messages = [{"role": "user", "content": TASKS[0].question}]
    with (
        caplog.at_level("WARNING", logger="conductor_pipeline.workers.runtime"),
        open_worker_pool(config, root=tmp_path) as pool,
    ):
        real = asyncio.run(pool("smollm2-135m", messages))
        simulated = asyncio.run(pool("sim-sage", messages))
        deadline = time.monotonic() + 30  # the watcher polls /health every 0.5 s
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not real.ok and "FileExistsError" in real.error
    assert simulated.ok
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "real worker's model failed to load (FileExistsError: " in warnings[0]
    assert "counts as an infra failure" in warnings[0]


@pytest.mark.usefixtures("unloadable_model")
def test_a_pool_without_the_real_worker_is_not_warned_of_its_failed_load(
    tasks_path, tmp_path, caplog
):
    config = sandbox_config(tasks_path, cache={"mode": "off"})
    config["sandbox"].update(load_real_model=True, workers=["sim-sage"])
    with (
        caplog.at_level("WARNING", logger="conductor_pipeline.workers.runtime"),
        open_worker_pool(config, root=tmp_path) as pool,
    ):
        health = pool.question_check.url + "/health"
        deadline = time.monotonic() + 30  # until the server has given up on the model
        while httpx.get(health, timeout=5).json()["status"] != "error":
            assert time.monotonic() < deadline, "the model load neither failed nor ended"
            time.sleep(0.1)
        time.sleep(1.0)  # twice the watcher's poll, had it been started
    assert not caplog.records
