"""The warm-start system: the same run's SFT-only adapter, evaluated like the Conductor when
the Conductor's adapter folder carries one in ``warm_start/``, and skipped when it does not."""

from __future__ import annotations

import asyncio
import logging

import pytest

from conductor_pipeline.evaluation import (
    EvaluationConfig,
    PolicyUnderTest,
    ResultStore,
    conductors,
    evaluate,
    results_frame,
    summarise,
)
from conductor_pipeline.workflow import OrchestrationConfig

from .fakes import FakePool, ScriptedConductor, make_tasks

TASKS = make_tasks(4)
SYSTEMS = {"systems": ["conductor", "conductor+recursion", "warm-start"]}


def _evaluate(pool, config, *, warm_start=None, store=None, conductor=None, tasks=TASKS):
    conductor = conductor or PolicyUnderTest(ScriptedConductor(), "trained", "trained adapter")
    return asyncio.run(
        evaluate(
            tasks,
            pool.view(),
            config,
            orchestration=OrchestrationConfig(max_tokens=8, max_parse_attempts=1),
            conductor=conductor,
            warm_start=warm_start,
            store=store,
            pool_id="p",
            progress=False,
        )
    )


def test_warm_start_gets_a_row_with_a_p_value_against_the_conductor():
    pool = FakePool(TASKS)
    # the warm start sends maths to the worker that gets it wrong (dud), the rest to ace
    warm = PolicyUnderTest(ScriptedConductor(math_worker=2), "warm-start:abc", "sft only")
    run = _evaluate(pool, EvaluationConfig.from_params(SYSTEMS), warm_start=warm)
    summary = summarise(results_frame(run.results), samples=200).set_index("system")
    assert list(summary.index) == ["conductor", "conductor+recursion", "warm-start"]
    assert summary.loc["conductor", "accuracy"] == 1.0
    assert summary.loc["warm-start", "accuracy"] == 0.5
    # 4 discordant pairs, all for the conductor: 2 * (1/2)^4
    assert summary.loc["warm-start", "p_value_vs_conductor"] == pytest.approx(0.125)
    assert summary.loc["warm-start", "policy"] == "sft only"
    assert summary.loc["warm-start", "steps_per_workflow"] == 1.0  # a workflow-writing system
    assert run.info["warm_start"] == "sft only"


def test_without_a_warm_start_the_listed_system_is_left_out():
    run = _evaluate(FakePool(TASKS), EvaluationConfig.from_params(SYSTEMS))
    assert "warm-start" not in {r.system for r in run.results}
    assert "warm_start" not in run.info


def test_a_new_warm_start_adapter_reruns_only_the_warm_start(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    config = EvaluationConfig.from_params(SYSTEMS)
    first = PolicyUnderTest(ScriptedConductor(math_worker=2), "warm-start:aaa", "first")
    _evaluate(FakePool(TASKS), config, warm_start=first, store=store)
    again = _evaluate(FakePool(TASKS), config, warm_start=first, store=store)
    assert again.info["pairs_run"] == 0
    newer = PolicyUnderTest(ScriptedConductor(math_worker=1), "warm-start:bbb", "newer")
    rerun = _evaluate(FakePool(TASKS), config, warm_start=newer, store=store)
    assert rerun.info["pairs_run"] == len(TASKS)  # the conductor's pairs were reused
    rows = [r for r in rerun.results if r.system == "warm-start"]
    assert all(r.correct for r in rows)


# -- resolving the warm start next to the Conductor's adapter folder ----------------------


def _adapter(folder, model_dir, seed: int):
    """A LoRA adapter of the tiny model (random B, so two seeds give different weights)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(model, lora).save_pretrained(folder)
    return folder


@pytest.fixture
def trained(tmp_path, tiny_model_dir):
    """A trained adapter folder holding its run's warm-start adapter in warm_start/."""
    folder = _adapter(tmp_path / "adapter", tiny_model_dir, seed=1)
    _adapter(folder / conductors.WARM_START_DIR, tiny_model_dir, seed=2)
    return folder


def _params(tiny_model_dir):
    return {"policy": {"kind": "local", "model_dir": str(tiny_model_dir)}}


def test_the_warm_start_folder_name_is_the_one_training_writes():
    from conductor_pipeline.training.artifacts import WARM_START_DIR

    assert conductors.WARM_START_DIR == WARM_START_DIR


def test_an_adapter_folder_with_a_warm_start_is_evaluated_under_both_names(trained, tiny_model_dir):
    params = _params(tiny_model_dir)
    config = EvaluationConfig.from_params({**SYSTEMS, "conductor": {"adapter": str(trained)}})
    conductor, _base = conductors.build_policies(params, config)
    warm = conductors.warm_start_policy(conductor, params, config)
    assert conductor.adapter_dir == str(trained)
    assert warm is not None and warm.adapter_dir == str(trained / conductors.WARM_START_DIR)
    assert warm.variant.startswith("warm-start:") and "warm-start" in warm.label

    # the real tiny model writes no workflow, but both systems are sampled and compared
    few = make_tasks(1)
    run = _evaluate(
        FakePool(few), EvaluationConfig.from_params({"systems": ["conductor", "warm-start"]}),
        warm_start=warm, conductor=conductor, tasks=few,
    )  # fmt: skip
    summary = summarise(results_frame(run.results), samples=200).set_index("system")
    assert list(summary.index) == ["conductor", "warm-start"]
    assert summary.loc["warm-start", "p_value_vs_conductor"] == 1.0
    assert summary.loc["warm-start", "n"] == len(few)

    # a new warm start changes its variant, not the conductor's
    _adapter(trained / conductors.WARM_START_DIR, tiny_model_dir, seed=3)
    conductor_again, _ = conductors.build_policies(params, config)
    assert conductor_again.variant == conductor.variant
    assert conductors.warm_start_policy(conductor_again, params, config).variant != warm.variant


def test_no_warm_start_folder_skips_with_an_info_log(tmp_path, tiny_model_dir, caplog):
    folder = _adapter(tmp_path / "champion-retrained", tiny_model_dir, seed=1)
    params = _params(tiny_model_dir)
    config = EvaluationConfig.from_params({**SYSTEMS, "conductor": {"adapter": str(folder)}})
    conductor, _ = conductors.build_policies(params, config)
    with caplog.at_level(logging.INFO, logger=conductors.logger.name):
        assert conductors.warm_start_policy(conductor, params, config) is None
    assert "warm-start skipped" in caplog.text and "warm_start/" in caplog.text


def test_no_adapter_or_not_listed_skips_silently(trained, tiny_model_dir, caplog):
    params = _params(tiny_model_dir)
    endpoint = PolicyUnderTest(ScriptedConductor(), "endpoint:x", "an endpoint")  # as in conf/gpu
    with caplog.at_level(logging.INFO, logger=conductors.logger.name):
        assert (
            conductors.warm_start_policy(endpoint, params, EvaluationConfig.from_params(SYSTEMS))
            is None
        )
    assert "not a local adapter" in caplog.text
    config = EvaluationConfig.from_params({"systems": ["conductor"]})
    conductor = PolicyUnderTest(ScriptedConductor(), "v", "v", adapter_dir=str(trained))
    assert conductors.warm_start_policy(conductor, params, config) is None
