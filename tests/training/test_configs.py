"""Training configuration: validation names the key; the shipped YAML files parse."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from conductor_pipeline.project import load_project_config
from conductor_pipeline.training.configs import (
    FULL_FINETUNE_LR,
    TrainingConfig,
    TrainingConfigError,
)
from conductor_pipeline.training.planner import SOLVE_WORDINGS, ReferencePlanner
from conductor_pipeline.workflow import parse_workflow, workflow_shape

from .fakes import make_task

ROOT = Path(__file__).resolve().parents[2]


def _params(env: str) -> dict:
    """``params:training`` as ``kedro run --env <env>`` resolves it (``conf/gpu`` keeps only
    what differs from ``conf/base``; the loader soft-merges the two)."""
    return load_project_config(env, root=ROOT).parameters["training"]


def test_defaults_are_valid():
    config = TrainingConfig.from_params({})
    assert config.grpo.batch_size == config.grpo.num_generations * config.grpo.prompts_per_step


@pytest.mark.parametrize(
    ("params", "path"),
    [
        (
            {"grpo": {"lerning_rate": 1e-5}},
            "training.grpo: unknown key 'lerning_rate' (did you mean 'learning_rate'?)",
        ),
        ({"lora": {"r": "eight"}}, "training.lora.r: must be an integer"),
        ({"grpo": {"num_generations": 1}}, "training.grpo.num_generations"),
        ({"grpo": {"loss_type": "ppo"}}, "training.grpo.loss_type"),
        ({"reward": {"cost_unit": "euros"}}, "training.reward.cost_unit"),
        ({"recursion": {"discount": 2}}, "training.recursion.discount"),
        ({"sft": {"domain_workers": ["a"]}}, "training.sft.domain_workers: must be a mapping"),
        (
            {"grpo": {"prompts_per_step": 3, "micro_batch_size": 5}},
            "training.grpo.micro_batch_size",
        ),
        ({"bogus": 1}, "training: unknown key 'bogus'; known keys: "),
        ({"grpo": 3}, "training.grpo: must be a mapping"),
        ({"seed": True}, "training.seed: must be an integer"),
        ({"grpo": {"bf16": "yes"}}, "training.grpo.bf16: bf16 must be true, false or auto"),
        ({"grpo": {"bf16": 1.5}}, "training.grpo.bf16: must be true or false or a string, got 1.5"),
        ({"grpo": {"entropy_coef": -0.1}}, "training.grpo.entropy_coef: entropy_coef must be >= 0"),
        (
            # the prompt is conductor.prompt, shared with evaluation and serving
            {"budget": {"max_steps": None}, "prompt": {"few_shot": 0}},
            "training: unknown key 'prompt'",
        ),
    ],
)
def test_bad_values_name_the_key(params, path):
    with pytest.raises(TrainingConfigError, match=re.escape(path)):
        TrainingConfig.from_params(params)


def test_fingerprint_ignores_operational_keys_only():
    base = TrainingConfig.from_params({})
    same = TrainingConfig.from_params({"output_dir": "elsewhere", "grpo": {"save_steps": 1}})
    other = TrainingConfig.from_params({"grpo": {"learning_rate": 1e-3}})
    assert base.fingerprint() == same.fingerprint() != other.fingerprint()
    assert TrainingConfig.from_params(base.to_dict()) == base


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_shipped_parameter_files_parse(env):
    config = TrainingConfig.from_params(_params(env))
    if env == "gpu":
        assert config.base_model == "Qwen/Qwen2.5-7B-Instruct"
        assert config.grpo.num_generations == 64 and config.grpo.prompts_per_step == 4
        assert config.grpo.use_vllm and not config.sft.enabled and config.grpo.beta == 0
        # LoRA, so a LoRA rate above the paper's full fine-tune rate of 1e-6
        assert config.lora.enabled and config.grpo.learning_rate > FULL_FINETUNE_LR
        assert config.grpo.max_steps == 200
    else:
        assert config.sft.enabled and not config.recursion.enabled and not config.grpo.use_vllm


@pytest.mark.parametrize("rate", [1e-6, 5e-7])
def test_lora_at_the_full_fine_tune_rate_is_refused(rate):
    with pytest.raises(TrainingConfigError) as err:
        TrainingConfig.from_params({"grpo": {"learning_rate": rate}})
    message = str(err.value)
    assert "grpo.learning_rate" in message and "LoRA" in message and "10x" in message
    # a full fine-tune may use the paper's rate
    full = TrainingConfig.from_params({"grpo": {"learning_rate": rate}, "lora": {"enabled": False}})
    assert full.grpo.learning_rate == rate


def test_sandbox_parameters_stay_small_for_mlflow():
    # kedro-mlflow logs every leaf of params:training as one MLflow param
    def leaves(node) -> int:
        if isinstance(node, dict):
            return sum(leaves(v) for v in node.values())
        return 1

    assert leaves(_params("base")) <= 80


def test_warm_start_planner_draws_workers_at_random_in_every_shape():
    """Format-only warm start: no domain decides a worker, every shape appears, and the
    workflows parse back to what was planned."""
    config = TrainingConfig.from_params(
        {
            "sft": {
                "shapes": {"single": 0.5, "solve_check": 0.25, "parallel_aggregate": 0.25},
                "max_parallel_attempts": 3,
                "subtask_wordings": 4,
            }
        }
    )
    assert config.sft.routing == "random" and not config.sft.domain_workers
    names = ["sim-sage", "sim-abacus", "sim-coder", "sim-sphinx", "sim-sprout"]
    planner = ReferencePlanner(names, config.sft, seed=1)
    shapes, solvers, lengths, wordings = set(), defaultdict(set), set(), set()
    for i in range(120):
        task = make_task(i, i, 1, domain=["math", "logic", "code"][i % 3])
        plan = planner.plan(task)
        parsed = parse_workflow(plan.text, len(names))
        assert parsed == plan.workflow
        assert task.question in parsed.steps[0].subtask
        # the plan is written once, in the lists: the reasoning only names the domain
        assert plan.reasoning == f"A {task.domain} question."
        shapes.add(plan.shape)
        solvers[task.domain].add(parsed.steps[0].worker)
        steps = parsed.steps
        assert workflow_shape(parsed) == plan.shape
        if plan.shape == "solve_check":
            assert len(steps) == 2 and steps[1].access == (0,)
        if plan.shape == "parallel_aggregate":
            attempts = len(steps) - 1
            lengths.add(len(steps))
            assert all(s.access == () for s in steps[:-1])
            assert steps[-1].access == tuple(range(attempts))
            assert len({s.worker for s in steps[:-1]}) == attempts  # separate opinions
        wordings.update(s.subtask for s in steps)
        assert planner.plan(task) == plan  # deterministic
    assert shapes == {"single", "solve_check", "parallel_aggregate"}
    assert lengths == {3, 4}  # two or three attempts before the aggregator
    assert len(wordings) >= 8  # subtasks are drawn from several wordings per role
    # every domain is sent to (almost) every worker: no table
    assert all(len(workers) >= 4 for workers in solvers.values()), solvers


@pytest.mark.parametrize("checker", [True, False])
@pytest.mark.parametrize("aggregator", [True, False])
def test_the_last_worker_is_a_solver_only_where_asked(checker, aggregator):
    """A self-check gains nothing (persistent errors, the paper's Table 7): by default the
    worker that checks or aggregates is another than the solvers, still drawn at random.
    Each shape has its own setting, and one leaves the other shape's draws as they were."""
    sft = {"distinct_checker": checker, "distinct_aggregator": aggregator}
    settings = TrainingConfig.from_params({"sft": sft}).sft
    planner = ReferencePlanner(["a", "b", "c", "d"], settings, question_to_workers=True)
    plans = [planner.plan(make_task(i, i, 1)) for i in range(300)]
    default = ReferencePlanner(
        ["a", "b", "c", "d"], TrainingConfig.from_params({}).sft, question_to_workers=True
    )
    usual = [default.plan(make_task(i, i, 1)) for i in range(300)]
    for shape, distinct in (("solve_check", checker), ("parallel_aggregate", aggregator)):
        multi = [[s.worker for s in p.workflow.steps] for p in plans if p.shape == shape]
        own = sum(workers[-1] in workers[:-1] for workers in multi)
        assert (own == 0) if distinct else (own > 10), (shape, own)
        assert {workers[-1] for workers in multi} == {0, 1, 2, 3}
        if distinct:  # the same examples as the default's, draw for draw
            mine = [p for p in plans if p.shape == shape]
            assert mine == [p for p in usual if p.shape == shape]


@pytest.mark.parametrize("in_order", [True, False])
def test_parallel_attempts_in_pool_order_when_asked(in_order):
    """With ``attempts_in_pool_order`` a set of parallel solvers is written one way (the
    pool's order); the examples are otherwise the same ones, workers and shapes alike."""
    params = {"shapes": {"parallel_aggregate": 1.0}, "max_parallel_attempts": 3}
    plain = ReferencePlanner(
        ["a", "b", "c", "d", "e"], TrainingConfig.from_params({"sft": params}).sft
    )
    settings = TrainingConfig.from_params(
        {"sft": {**params, "attempts_in_pool_order": in_order}}
    ).sft
    planner = ReferencePlanner(["a", "b", "c", "d", "e"], settings)
    orders = set()
    for i in range(200):
        task = make_task(i, i, 1)
        *solvers, last = [s.worker for s in planner.plan(task).workflow.steps]
        *usual, usual_last = [s.worker for s in plain.plan(task).workflow.steps]
        assert (sorted(solvers), last) == (sorted(usual), usual_last)
        orders.add(solvers == sorted(solvers))
    assert orders == ({True} if in_order else {True, False})


def test_warm_start_defaults_write_one_wording_per_role_and_mostly_multi_step():
    """The default examples: multi-step shapes weigh most, a parallel workflow has two
    attempts, and each role has one fixed wording (lists of equal length are easier to
    keep for a small model when each entry has a fixed length)."""
    settings = TrainingConfig.from_params({}).sft
    assert settings.shapes["single"] < 0.5 and settings.max_parallel_attempts == 2
    planner = ReferencePlanner(["a", "b", "c", "d"], settings, question_to_workers=True)
    plans = [planner.plan(make_task(i, i, 1)) for i in range(200)]
    shapes = {p.shape for p in plans}
    assert shapes == {"single", "solve_check", "parallel_aggregate"}
    multi = sum(p.shape != "single" for p in plans) / len(plans)
    assert multi > 0.6
    by_role = {s.subtask for p in plans for s in p.workflow.steps}
    assert len(by_role) == 3  # one solve, one check and one aggregate wording
    assert {len(p.workflow) for p in plans if p.shape == "parallel_aggregate"} == {3}


def test_domain_table_routing_is_kept_as_a_named_option():
    config = TrainingConfig.from_params(
        {
            "sft": {
                "routing": "domain_table",
                "shapes": {"single": 1.0},
                "domain_workers": {"math": "sim-abacus", "logic": "nobody"},
            }
        }
    )
    names = ["sim-sage", "sim-abacus"]
    planner = ReferencePlanner(names, config.sft)
    assert planner.plan(make_task(0, 1, 2, domain="math")).workflow.steps[0].worker == 1
    # a name the pool lacks falls back to worker 0
    assert planner.plan(make_task(1, 1, 2, domain="logic")).workflow.steps[0].worker == 0


@pytest.mark.parametrize(
    ("sft", "message"),
    [
        ({"routing": "oracle"}, "training.sft.routing"),
        ({"shapes": {"tree": 1.0}}, "unknown shape"),
        ({"shapes": {"single": 0.0}}, "not all 0"),
        ({"shapes": {"single": "many"}}, "training.sft.shapes.single: must be a number"),
        ({"max_parallel_attempts": 1}, "training.sft.max_parallel_attempts"),
        ({"subtask_wordings": 0}, "training.sft.subtask_wordings"),
    ],
)
def test_bad_warm_start_settings_name_the_key(sft, message):
    with pytest.raises(TrainingConfigError, match=message):
        TrainingConfig.from_params({"sft": sft})


def test_planner_writes_a_short_instruction_when_workers_see_the_question():
    config = TrainingConfig.from_params({"sft": {"shapes": {"single": 1.0}}})
    planner = ReferencePlanner(["a", "b"], config.sft, question_to_workers=True)
    task = make_task(0, 3, 4)
    plan = planner.plan(task)
    subtask = parse_workflow(plan.text, 2).steps[0].subtask
    assert task.question not in subtask and subtask in SOLVE_WORDINGS


@pytest.mark.parametrize(
    ("setting", "use_cpu", "native", "expected"),
    [
        (True, True, False, True),  # asked for: emulated on this CPU, but done
        (False, True, True, False),
        ("auto", True, True, True),  # AMX or AVX512-BF16
        ("auto", True, False, False),  # elsewhere bfloat16 is slower than float32
    ],
)
def test_bf16_auto_follows_the_cpu(monkeypatch, setting, use_cpu, native, expected):
    from conductor_pipeline.training import trainer_args
    from conductor_pipeline.workers import local_model

    monkeypatch.setattr(local_model, "native_bfloat16", lambda: native)
    config = TrainingConfig.from_params({"grpo": {"bf16": setting}})
    assert config.grpo.bf16 == setting
    assert trainer_args.use_bf16(config.grpo.bf16, use_cpu) is expected
    assert trainer_args.grpo_args(config, "/tmp/unused", use_cpu=use_cpu).bf16 is expected


def test_sandbox_trains_in_bfloat16_where_the_cpu_multiplies_it():
    assert _params("base")["grpo"]["bf16"] == "auto"
    assert _params("gpu")["grpo"]["bf16"] is True


def test_entropy_bonus_reaches_trl():
    """``training.grpo.entropy_coef`` is TRL's entropy bonus: off by default, on when set."""
    from conductor_pipeline.training import trainer_args

    default = trainer_args.grpo_args(TrainingConfig.from_params({}), "/tmp/unused", use_cpu=True)
    assert default.entropy_coef == 0.0
    config = TrainingConfig.from_params({"grpo": {"entropy_coef": 0.05}})
    assert trainer_args.grpo_args(config, "/tmp/unused", use_cpu=True).entropy_coef == 0.05
    assert config.fingerprint() != TrainingConfig.from_params({}).fingerprint()


@pytest.mark.parametrize(
    ("model_dtype", "bf16", "native", "expected"),
    [
        ("auto", "auto", True, "bfloat16"),  # a CPU that multiplies bfloat16
        ("auto", "auto", False, "float32"),  # one that would emulate it
        ("auto", False, True, "float32"),  # training told to stay in float32
        (None, "auto", True, "float32"),
        ("bfloat16", False, False, "bfloat16"),
    ],
)
def test_the_base_loads_in_bfloat16_where_training_computes_in_it(
    monkeypatch, model_dtype, bf16, native, expected
):
    from conductor_pipeline.training import trainer_args
    from conductor_pipeline.training.models import base_dtype
    from conductor_pipeline.workers import local_model

    monkeypatch.setattr(trainer_args, "_cuda_available", lambda: False)
    monkeypatch.setattr(local_model, "native_bfloat16", lambda: native)
    params = {
        **_params("base"),
        "grpo": {**_params("base")["grpo"], "model_dtype": model_dtype, "bf16": bf16},
    }
    assert base_dtype(TrainingConfig.from_params(params)) == expected
