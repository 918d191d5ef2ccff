"""Every shipped configuration profile validates: base (the sandbox) and gpu (full scale)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conductor_pipeline.evaluation.config import EvaluationConfig
from conductor_pipeline.pipelines.data_prep.nodes import validate_params
from conductor_pipeline.project import load_project_config
from conductor_pipeline.serving.settings import serving_settings
from conductor_pipeline.training.configs import FULL_FINETUNE_LR, TrainingConfig
from conductor_pipeline.workers import load_worker_specs
from conductor_pipeline.workflow.config import build_policy, orchestration_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_profile_validates(env, monkeypatch):
    for variable in ("GEMINI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "VLLM_API_KEY"):
        monkeypatch.setenv(variable, "dummy")
    config = load_project_config(env, root=REPO)
    validate_params(config.parameters["data_prep"])
    orchestration_config(config.parameters["conductor"])
    if config.worker_pool["kind"] == "configured":
        specs = load_worker_specs(
            {
                "workers": config.worker_pool["workers"],
                "defaults": config.worker_pool.get("defaults", {}),
            }
        )
        assert len(specs) == 7 and all(spec.description for spec in specs)


def test_gpu_profile_follows_the_paper():
    config = load_project_config("gpu", root=REPO)
    conductor = orchestration_config(config.parameters["conductor"])
    assert conductor.max_parse_attempts == 5
    # the paper's recursion round is measured (conductor+recursion), not served: gpu training
    # does not train it
    assert conductor.max_rounds == 0 and not config.parameters["training"]["recursion"].get(
        "enabled", False
    )
    assert "conductor+recursion" in config.parameters["evaluation"]["systems"]
    assert TrainingConfig.from_params(config.parameters["training"]).lora.dropout == 0.0
    assert conductor.temperature == 1.0 and conductor.max_tokens == 1024
    quotas = config.parameters["data_prep"]["domain_quota"]
    train_share = config.parameters["data_prep"]["split_ratios"]["train"]
    # the paper trains on 960 problems, balanced: the train split, not the quota, holds them
    assert sum(quotas.values()) * train_share == 960 and len(set(quotas.values())) == 1


@pytest.mark.parametrize("env", ["base", "gpu"])
@pytest.mark.parametrize("served_rounds", [None, 1])
def test_the_promoted_conductor_is_evaluated_with_the_rounds_it_is_served_with(
    env, served_rounds, tmp_path
):
    """Promotion gates the ``conductor`` system; serving and ``conductor ask`` run
    ``conductor.max_rounds``: the two are the same rounds, whatever the profile says."""
    from types import SimpleNamespace

    from conductor_pipeline.evaluation.kinds import Conductor, ConductorRecursion
    from conductor_pipeline.evaluation.registry import RunContext

    params = load_project_config(env, root=REPO).parameters
    if served_rounds is not None:
        params["conductor"]["max_rounds"] = served_rounds
    served = orchestration_config(params["conductor"])
    evaluation = EvaluationConfig.from_params(params["evaluation"])
    model = SimpleNamespace(policy=object(), variant="v1", label="conductor/1")
    ctx = RunContext(
        config=evaluation,
        pool=SimpleNamespace(names=("w",)),
        orchestration=served,
        test_tasks=[],
        validation_tasks=[],
        pool_id="pool",
        policies={"conductor": model},
        shared=lambda policy: policy,
        runner=None,
        worker_limit=None,
    )
    (evaluated,) = Conductor().systems(ctx)
    assert evaluated.config == served  # the same rounds, budget, sampling and prompt
    (recursion,) = ConductorRecursion().systems(ctx)
    assert recursion.config.max_rounds == evaluation.conductor.recursion_rounds


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_the_conductor_is_evaluated_with_the_parse_attempts_it_is_served_with(env):
    """A reply that does not parse is sampled again by serving and ``conductor ask`` up to
    ``conductor.max_parse_attempts`` times; the evaluation of the Conductor systems does the
    same, or the table reports format failures users never see."""
    params = load_project_config(env, root=REPO).parameters
    served = orchestration_config(params["conductor"])
    evaluated = EvaluationConfig.from_params(params["evaluation"]).conductor.max_parse_attempts
    assert evaluated in (None, served.max_parse_attempts)


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_a_local_conductor_is_evaluated_in_the_precision_it_is_served_in(env):
    """A server loads a local Conductor in ``serving.dtype``; evaluation and ``conductor
    ask`` load it in ``conductor.policy.dtype``. Where the two differ, the table scores
    texts the server does not write (bfloat16 changes some of them)."""
    params = load_project_config(env, root=REPO).parameters
    policy = params["conductor"]["policy"]
    if policy.get("kind", "local") == "local":
        served = serving_settings(params["serving"]).dtype
        assert build_policy(policy).dtype == served  # the setting, or build_policy's default


def test_gpu_profile_trains_lora_at_a_lora_rate():
    """The paper's lr 1e-6 is for a full fine-tune; the gpu profile trains LoRA, whose
    update needs a rate well above that (about 10x) to move in 200 steps."""
    config = load_project_config("gpu", root=REPO)
    training = TrainingConfig.from_params(config.parameters["training"])
    if training.lora.enabled:
        assert training.grpo.learning_rate >= 10 * FULL_FINETUNE_LR


# conf/gpu's parameters as resolved before it was soft-merged over conf/base (when it still
# repeated every leaf it shared with base); a deliberate change of a gpu value updates it.
GPU_BEFORE = REPO / "tests" / "fixtures" / "config" / "gpu_parameters_before_soft_merge.json"


def _copy_conf(tmp_path: Path, local: dict[str, str] | None = None) -> Path:
    """A copy of the shipped profiles with ``local`` as conf/local (file name -> YAML): a
    developer's own conf/local stays out of the comparison."""
    conf = tmp_path / "conf"
    for shipped in ("base", "gpu"):
        shutil.copytree(REPO / "conf" / shipped, conf / shipped)
    (conf / "local").mkdir()
    for name, text in (local or {}).items():
        (conf / "local" / name).write_text(text)
    return conf


def _loader(conf: Path, env: str):
    """The loader ``kedro run --env`` and the CLI (project.load_project_config) both build."""
    from conductor_pipeline.settings import CONFIG_LOADER_ARGS, CONFIG_LOADER_CLASS

    return CONFIG_LOADER_CLASS(conf_source=str(conf), env=env, **CONFIG_LOADER_ARGS)


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out.update(_leaves(value, path))
        else:
            out[path] = value
    return out


def test_gpu_parameters_are_unchanged_by_the_soft_merge(tmp_path):
    """conf/gpu now holds only what differs from conf/base: every value it resolved to before
    still resolves the same, and the leaves it now takes from base change no parsed config."""
    before = json.loads(GPU_BEFORE.read_text())
    # changed on purpose since the snapshot: gpu serves the rounds its promotion evaluated (0)
    before["conductor"]["max_rounds"] = 0
    before["training"]["lora"]["dropout"] = 0.0  # and trains without LoRA dropout, as the paper
    # and prefills the opening of the Conductor's reply, as the paper (training continues it)
    gpu_prompt = yaml.safe_load((REPO / "conf/gpu/parameters_conductor.yml").read_text())
    prefill = gpu_prompt["conductor"]["prompt"]["assistant_prefill"]
    assert prefill.strip()
    before["conductor"].setdefault("prompt", {})["assistant_prefill"] = prefill
    # and trains on the paper's 960 (300 a domain, 0.8 of them in train), and evaluates RLPR
    # on its held-out test set instead of its train split
    before["data_prep"]["domain_quota"] = dict.fromkeys(before["data_prep"]["domain_quota"], 300)
    before["evaluation"]["benchmarks"]["rlpr"] = {
        "split": "test",
        "data_files": "data/gpu/01_raw/rlpr/WebInstruct-verified-val_Avg2.parquet",
    }
    # and names where TRL's server mode finds its vLLM server, off evaluation's port
    before["training"]["grpo"]["vllm_server_base_url"] = "http://127.0.0.1:8100"
    # and stops by itself when rollouts stay masked or the worker budget is spent
    before["training"]["caps"] = {
        "max_masked_rate": 0.5,
        "masked_rate_window": 5,
        "max_worker_cost_usd": 1500,
    }
    # and keeps its own data tree and registered model (conf/gpu/globals.yml)
    for section, key, value in (
        ("conductor", "policy", {"adapter": "models:/conductor-qwen@champion"}),
        ("evaluation", "store", "data/gpu/07_model_output/evaluation/results.jsonl"),
        ("reporting", "output_dir", "data/gpu/08_reporting"),
        ("training", "output_dir", "data/gpu/06_models/conductor"),
        ("retraining", "start_from", "models:/conductor-qwen@champion"),
        ("retraining", "lock", {"path": "data/gpu/retraining.lock"}),
        ("serving", "capture", {"path": "data/gpu/01_raw/traffic"}),
        ("retraining", "logged_questions", {"paths": ["data/gpu/01_raw/logged_questions/*.jsonl"]}),
    ):
        if isinstance(value, dict):
            before[section].setdefault(key, {}).update(value)
        else:
            before[section][key] = value
    after = load_project_config("gpu", root=_copy_conf(tmp_path).parent).parameters
    recorded = _leaves(before)
    assert {path: value for path, value in _leaves(after).items() if path in recorded} == recorded
    assert after["data_prep"] == before["data_prep"]  # sources and quotas replaced, not merged
    assert orchestration_config(after["conductor"]) == orchestration_config(before["conductor"])
    # model_dir, torch_threads, lookup_tokens and dtype are read by a local policy only;
    # gpu's is an endpoint
    local_only = {"model_dir", "torch_threads", "lookup_tokens", "dtype"}
    assert after["conductor"]["policy"]["kind"] == "endpoint"
    assert {k: v for k, v in after["conductor"]["policy"].items() if k not in local_only} == before[
        "conductor"
    ]["policy"]
    # gpu has no warm start, so the sandbox's SFT settings it inherits are never read
    trained_after = TrainingConfig.from_params(after["training"])
    trained_before = TrainingConfig.from_params(before["training"])
    assert not trained_after.sft.enabled and not trained_before.sft.enabled
    # nor a curriculum, so the unsolved_share it inherits is never read either
    assert trained_after.curriculum.reference_worker is None
    assert trained_before.curriculum.reference_worker is None
    assert (
        replace(trained_after, sft=trained_before.sft, curriculum=trained_before.curriculum)
        == trained_before
    )
    assert EvaluationConfig.from_params(after["evaluation"]) == EvaluationConfig.from_params(
        before["evaluation"]
    )
    assert serving_settings(after["serving"]) == serving_settings(before["serving"])
    # a gate added to conf/base after the snapshot reaches gpu through the merge, at its
    # base default; every gate gpu had keeps its value
    gates, gates_before = after["promotion"]["gates"], before["promotion"]["gates"]
    assert {k: v for k, v in gates.items() if k in gates_before} == gates_before
    assert set(gates) - set(gates_before) == {"max_slice_accuracy_drop"}
    assert {k: v for k, v in after["promotion"].items() if k != "gates"} == {
        k: v for k, v in before["promotion"].items() if k != "gates"
    }


def test_the_catalog_is_not_merged(tmp_path):
    """The catalog (no gpu files) is base's, in gpu's own data tree (globals.yml data_root)."""
    conf = _copy_conf(tmp_path)
    # read before the next loader exists: the last one built answers every `${globals:}`
    base_catalog = dict(_loader(conf, "base")["catalog"])
    gpu_catalog = dict(_loader(conf, "gpu")["catalog"])
    assert gpu_catalog.keys() == base_catalog.keys()
    assert json.loads(json.dumps(gpu_catalog).replace("data/gpu/", "data/")) == base_catalog


# conf/gpu/workers.yml as loaded while it still repeated base's cache, usage log and faults
GPU_WORKERS_BEFORE = REPO / "tests" / "fixtures" / "config" / "gpu_workers_before_soft_merge.json"


def test_gpu_workers_are_unchanged_by_the_soft_merge(tmp_path):
    """conf/gpu/workers.yml holds only what differs from base; merged, it is the pool it was
    (configured, its own data tree, no sandbox section)."""
    gpu = _loader(_copy_conf(tmp_path), "gpu")["workers"]
    assert gpu == json.loads(GPU_WORKERS_BEFORE.read_text())
    assert "sandbox" not in gpu["worker_pool"]


def test_an_environment_overrides_single_worker_pool_leaves(tmp_path):
    """conf/local/workers.yml sets one leaf and keeps the rest of base's pool; a list it sets
    (the sandbox's workers) replaces base's."""
    conf = _copy_conf(
        tmp_path,
        {"workers.yml": "worker_pool: {sandbox: {seed: 7, workers: [sim-sage]}}\n"},
    )
    base = _loader(conf, "base")["workers"]["worker_pool"]
    local = _loader(conf, "local")["workers"]["worker_pool"]
    assert local["sandbox"]["seed"] == 7 and local["sandbox"]["workers"] == ["sim-sage"]
    assert {k: v for k, v in local["sandbox"].items() if k not in ("seed", "workers")} == {
        k: v for k, v in base["sandbox"].items() if k not in ("seed", "workers")
    }
    assert {k: v for k, v in local.items() if k != "sandbox"} == {
        k: v for k, v in base.items() if k != "sandbox"
    }


def test_a_local_configured_pool_drops_the_sandbox_section(tmp_path):
    """An environment that switches the pool's kind keeps base's cache and faults, not the
    other kind's section."""
    local_pool = "worker_pool: {kind: configured, workers: [{name: w, model: openai/w}]}\n"
    conf = _copy_conf(tmp_path, {"workers.yml": local_pool})
    base = _loader(conf, "base")["workers"]["worker_pool"]
    local = _loader(conf, "local")["workers"]["worker_pool"]
    assert "sandbox" not in local and local["workers"] == [{"name": "w", "model": "openai/w"}]
    assert local["cache"] == base["cache"] and local["faults"] == base["faults"]


def test_an_environment_overrides_single_leaves(tmp_path):
    """conf/local (the default run env) sets one leaf and keeps base's siblings; a source list
    it sets replaces base's instead of adding to it."""
    conf = _copy_conf(
        tmp_path,
        {
            "parameters_training.yml": "training: {grpo: {max_steps: 3}}\n",
            "parameters_data_prep.yml": "data_prep: {sources: {humaneval: {}}}\n",
        },
    )
    base, local = _loader(conf, "base")["parameters"], _loader(conf, "local")["parameters"]
    assert local["training"]["grpo"]["max_steps"] == 3
    assert {k: v for k, v in local["training"]["grpo"].items() if k != "max_steps"} == {
        k: v for k, v in base["training"]["grpo"].items() if k != "max_steps"
    }
    assert local["training"]["lora"] == base["training"]["lora"]
    assert local["data_prep"]["sources"] == {"humaneval": {}}
    assert local["data_prep"]["domain_quota"] == base["data_prep"]["domain_quota"]
