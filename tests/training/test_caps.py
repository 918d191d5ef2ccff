"""training.caps: a GRPO run stops by itself, keeping the checkpoint of the step it stopped
at, when its rollouts stay mostly masked or have spent the worker budget; a resumed run
carries the spend over, and a raised cap lets it finish."""

from __future__ import annotations

import pytest

from conductor_pipeline.training.caps import SPENT_KEY, STREAK_KEY, RunCaps, TrainingStopped
from conductor_pipeline.training.configs import CapsSettings, TrainingConfig, TrainingConfigError

from .fakes import FakePool, make_task

QUESTION = make_task().question
PROMPT = {"few_shot": []}


# -- the bookkeeping ----------------------------------------------------------------------------


def _step(masked: float, cost: float = 0.0) -> dict[str, float]:
    return {"rollouts/masked_rate": masked, "workflow/cost_usd_sum": cost, "rollouts/n": 4.0}


def test_masked_rate_stops_after_the_window_of_consecutive_steps_only():
    caps = RunCaps(CapsSettings(max_masked_rate=0.5, masked_rate_window=3))
    for step, rate in enumerate([0.9, 0.9, 0.2, 0.75, 0.9], start=1):
        caps.observe(_step(rate), step)
    assert caps.stop_reason is None  # the low step 3 broke the streak
    assert caps.masked_streak == 2
    caps.observe({}, 6)  # a step without new rollouts counts for nothing
    assert caps.stop_reason is None and caps.masked_streak == 2
    caps.observe(_step(1.0), 7)
    reason = caps.stop_reason
    assert reason is not None and "step 7" in reason
    assert "training.caps.max_masked_rate 0.5" in reason and "masked_rate_window 3" in reason
    assert "100%" in reason  # the rate of the step it stopped at


def test_worker_budget_stops_at_the_cap_and_says_how_to_continue():
    caps = RunCaps(CapsSettings(max_worker_cost_usd=10.0))
    caps.observe(_step(0.0, 4.0), 1)
    caps.observe(_step(0.0, 5.5), 2)
    assert caps.stop_reason is None and caps.spent_usd == pytest.approx(9.5)
    caps.observe(_step(0.0, 0.5), 3)
    assert caps.stop_reason is not None
    assert "$10.00" in caps.stop_reason and "max_worker_cost_usd" in caps.stop_reason
    assert "--params training.caps.max_worker_cost_usd=" in caps.stop_reason


def test_restore_continues_the_count_of_a_resumed_stage():
    caps = RunCaps(CapsSettings(max_worker_cost_usd=10.0))
    history = [{"loss": 1.0, SPENT_KEY: 3.0, STREAK_KEY: 1.0}, {"loss": 0.5}, {"loss": 0.4}]
    caps.restore(history)
    assert caps.spent_usd == 3.0 and caps.masked_streak == 1
    fresh = RunCaps(CapsSettings(), spent_usd=2.0)
    fresh.restore([])  # a stage that starts afresh keeps what earlier stages spent
    assert fresh.spent_usd == 2.0
    caps.restore([{SPENT_KEY: 10.0}])
    with pytest.raises(TrainingStopped, match="before its next step"):
        caps.check_budget_left()


def test_caps_are_validated_and_left_out_of_the_run_fingerprint():
    base = TrainingConfig.from_params({})
    capped = TrainingConfig.from_params(
        {"caps": {"max_masked_rate": 0.5, "masked_rate_window": 3, "max_worker_cost_usd": 100}}
    )
    assert capped.caps.max_worker_cost_usd == 100.0
    assert capped.fingerprint() == base.fingerprint()  # raising a cap resumes the same run
    with pytest.raises(TrainingConfigError, match="training.caps.max_masked_rate"):
        TrainingConfig.from_params({"caps": {"max_masked_rate": 1.5}})
    with pytest.raises(TrainingConfigError, match="training.caps: unknown key 'max_worker_cost'"):
        TrainingConfig.from_params({"caps": {"max_worker_cost": 5}})


def test_the_gpu_profile_sets_both_caps_and_the_sandbox_none():
    from conductor_pipeline.project import load_project_config

    gpu = TrainingConfig.from_params(load_project_config("gpu").parameters["training"]).caps
    assert gpu.max_masked_rate is not None and gpu.max_worker_cost_usd is not None
    sandbox = TrainingConfig.from_params(load_project_config().parameters["training"]).caps
    assert sandbox.max_masked_rate is None and sandbox.max_worker_cost_usd is None


# -- in a real GRPO run (tiny random Llama, forced completions) ----------------------------------


def _config(tiny_model_dir, out, caps, max_steps=4) -> TrainingConfig:
    return TrainingConfig.from_params(
        {
            "base_model": str(tiny_model_dir),
            "seed": 0,
            "output_dir": str(out),
            "grpo": {
                "num_generations": 4,
                "prompts_per_step": 1,
                "max_steps": max_steps,
                "max_completion_length": 48,
                "learning_rate": 1e-3,
                "save_steps": 100,  # no regular checkpoint: the only one is the cap's
            },
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "sft": {"enabled": False},
            "reward": {"retry_delay_s": 0.0, "infra_retries": 0},
            "caps": caps,
        }
    )


def _forcing(tokenizer, workers) -> dict:
    """Completions that route the question to one of ``workers`` (see test_grpo)."""
    from tests.training.test_grpo import _forcing as forcing

    branches = [
        f"Route it.\nmodel_id = [{w}]\nsubtasks = [{QUESTION!r}]\naccess_list = [[]]"
        for w in workers
    ]
    return {"generation_kwargs": forcing(tokenizer, branches)}


def _train(tiny_model_dir, config, pool, overrides, logged=None):
    from conductor_pipeline.training.grpo import train_conductor
    from conductor_pipeline.training.inputs import PoolInfo

    tasks = [make_task(i) for i in range(4)]
    pool.tasks = tasks
    info = PoolInfo(pool, pool.names, pool.descriptions, pool.prices)
    log = (lambda m, step: logged.append((m, step))) if logged is not None else None
    return train_conductor(
        tasks, info, config, prompt=PROMPT, log_metrics=log, grpo_overrides=overrides
    )


@pytest.mark.slow
def test_a_run_whose_rollouts_stay_masked_stops_with_a_checkpoint(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pool = FakePool([], broken=(0, 1, 2))  # every worker call fails: every rollout masked
    config = _config(tiny_model_dir, tmp_path, {"max_masked_rate": 0.5, "masked_rate_window": 2})
    logged: list = []
    with pytest.raises(TrainingStopped) as stopped:
        _train(tiny_model_dir, config, pool, _forcing(tokenizer, [0, 1, 2]), logged)
    message = str(stopped.value)
    assert "step 2" in message and "max_masked_rate 0.5" in message and "window 2" in message
    assert [step for metrics, step in logged if "grpo/loss" in metrics] == [1, 2]  # no step 3
    run_dir = next((tmp_path / "runs").iterdir())
    assert [p.name for p in (run_dir / "grpo").glob("checkpoint-*")] == ["checkpoint-2"]
    assert not (run_dir / "adapter").exists()  # nothing published from a stopped run


@pytest.mark.slow
def test_the_worker_budget_stops_the_run_and_a_raised_cap_resumes_it(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    overrides = _forcing(tokenizer, [0, 1])
    per_step = 4 * (10 * 1e-6 + 5 * 2e-6)  # 4 rollouts of one call each (FakePool prices)
    logged: list = []
    capped = _config(tiny_model_dir, tmp_path, {"max_worker_cost_usd": 1.5 * per_step})
    with pytest.raises(TrainingStopped, match=r"max_worker_cost_usd") as stopped:
        _train(tiny_model_dir, capped, FakePool([], broken=()), overrides, logged)
    assert "step 2" in str(stopped.value)
    spent = [m["grpo/caps/worker_cost_usd"] for m, _ in logged if "grpo/caps/worker_cost_usd" in m]
    assert spent == pytest.approx([per_step, 2 * per_step])
    run_dir = next((tmp_path / "runs").iterdir())
    assert [p.name for p in (run_dir / "grpo").glob("checkpoint-*")] == ["checkpoint-2"]

    # run again with the same cap: the spend is carried over, so nothing more is trained
    pool = FakePool([], broken=())
    with pytest.raises(TrainingStopped, match="before its next step"):
        _train(tiny_model_dir, capped, pool, overrides)
    assert sum(pool.calls.values()) == 0

    # a raised cap: the same run (same fingerprint) resumes from the checkpoint and finishes
    raised = _config(tiny_model_dir, tmp_path, {"max_worker_cost_usd": 10 * per_step})
    logged = []
    result = _train(tiny_model_dir, raised, FakePool([], broken=()), overrides, logged)
    assert result.run_dir == run_dir and result.resumed_from.endswith("checkpoint-2")
    assert result.global_step == 4
    spent = {
        step: m["grpo/caps/worker_cost_usd"]
        for m, step in logged
        if "grpo/caps/worker_cost_usd" in m
    }
    assert spent == pytest.approx({3: 3 * per_step, 4: 4 * per_step})
