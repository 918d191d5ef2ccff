"""Serving configuration (both profiles validate, bad keys are named), the scripted policy
kind, and which Conductor is served: registry alias or version, adapter folder, or base."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from conductor_pipeline.cli import build_parser
from conductor_pipeline.project import load_project_config
from conductor_pipeline.serving.models import (
    ModelResolutionError,
    ServedModel,
    registry_uri,
    resolve_served_model,
)
from conductor_pipeline.serving.settings import serving_settings
from conductor_pipeline.workflow import OrchestrationConfig, PromptConfig, orchestrate
from conductor_pipeline.workflow.config import build_policy
from conductor_pipeline.workflow.policy import ScriptedPolicy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_serving_profiles_validate(env):
    settings = serving_settings(load_project_config(env, root=REPO).parameters["serving"])
    assert settings.host == "127.0.0.1" and settings.port == 8700
    if env == "gpu":
        assert settings.policy_server == "vllm" and settings.require_api_key
        assert settings.vllm.base_model == "Qwen/Qwen2.5-7B-Instruct"
    else:
        assert settings.policy_server == "local" and not settings.require_api_key


@pytest.mark.parametrize(
    ("params", "phrase"),
    [
        ({"hots": "x"}, "serving: unknown key 'hots' \\(did you mean 'host'\\?\\)"),
        ({"policy_server": "tgi"}, "serving.policy_server"),
        ({"max_concurrency": 0}, "serving.max_concurrency"),
        ({"request_timeout_s": 0}, "serving.request_timeout_s"),
        ({"limits": {"max_step": 1}}, "serving.limits: unknown key 'max_step'"),
        ({"limits": {"max_steps": -1}}, "serving.limits.max_steps"),
        ({"vllm": {"port": 1, "gpus": 2}}, "serving.vllm: unknown key 'gpus'"),
    ],
)
def test_bad_serving_settings_name_the_key(params, phrase):
    with pytest.raises(ValueError, match=phrase):
        serving_settings(params)


def test_scripted_policy_kind():
    policy = build_policy({"kind": "scripted", "worker": 2})
    assert isinstance(policy, ScriptedPolicy) and policy.name == "scripted:worker-2"
    with pytest.raises(ValueError, match="conductor.policy.worker"):
        build_policy({"kind": "scripted", "worker": -1})
    with pytest.raises(ValueError, match="'scripted'"):
        build_policy({"kind": "oracle"})


def test_local_policy_thread_cap():
    from conductor_pipeline.workflow import LocalPolicy

    policy = build_policy({"kind": "local", "torch_threads": 1})
    assert isinstance(policy, LocalPolicy) and policy.torch_threads == 1
    assert build_policy({"kind": "local"}).torch_threads is None
    with pytest.raises(ValueError, match="torch_threads"):
        LocalPolicy(torch_threads=0)


def test_a_served_local_conductor_takes_the_servers_threads_not_evaluations():
    from conductor_pipeline.serving.batching import MicroBatchingPolicy
    from conductor_pipeline.serving.server import in_process_policy
    from conductor_pipeline.serving.settings import serving_settings
    from conductor_pipeline.workflow import LocalPolicy

    evaluation_params = {"kind": "local", "torch_threads": 1}
    every_core = in_process_policy(evaluation_params, None, serving_settings({}))
    assert isinstance(every_core, MicroBatchingPolicy)
    assert isinstance(every_core.policy, LocalPolicy) and every_core.policy.torch_threads is None
    two = in_process_policy(evaluation_params, None, serving_settings({"torch_threads": 2}))
    assert two.policy.torch_threads == 2
    scripted = in_process_policy({"kind": "scripted"}, None, serving_settings({}))
    assert scripted.name.startswith("scripted")  # no model: not batched
    for bad in (0, True, "2"):
        with pytest.raises(ValueError, match="serving.torch_threads"):
            serving_settings({"torch_threads": bad})


def test_local_policy_precision_from_conductor_policy_and_for_a_server_from_serving():
    from conductor_pipeline.serving.server import in_process_policy
    from conductor_pipeline.serving.settings import serving_settings
    from conductor_pipeline.workflow import LocalPolicy

    assert build_policy({"kind": "local"}).dtype == "auto"  # as a server loads it
    assert build_policy({"kind": "local", "dtype": "bfloat16"}).dtype == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be one of"):
        LocalPolicy(dtype="float16")
    evaluation_params = {"kind": "local", "dtype": "float32"}
    assert in_process_policy(evaluation_params, None, serving_settings({})).policy.dtype == "auto"
    pinned = in_process_policy(evaluation_params, None, serving_settings({"dtype": "float32"}))
    assert pinned.policy.dtype == "float32"
    for bad in ("fp16", None, 32):
        with pytest.raises(ValueError, match="serving.dtype"):
            serving_settings({"dtype": bad})


def test_scripted_policy_writes_one_step_with_the_question():
    async def pool(worker, messages, sample_index=0):
        from conductor_pipeline.workers.types import Usage, WorkerReply

        return WorkerReply(f"w{worker}", messages[-1]["content"], Usage())

    question = "Is 'x' == \"y\"?\nSecond line."
    for prefill in ("", "model_id = [", "Thinking first."):
        config = OrchestrationConfig(prompt=PromptConfig(assistant_prefill=prefill), max_rounds=1)
        result = asyncio.run(
            orchestrate(question, ScriptedPolicy(1), pool, ["a", "b", "c"], config=config)
        )
        assert not result.format_failure
        (step,) = result.rounds[0].execution.steps
        assert (step.worker, step.subtask, step.access) == (1, question, ())
        assert result.rounds[1].kept_previous  # the recursion round keeps the answer


def test_model_references():
    assert registry_uri("conductor@champion") == "models:/conductor@champion"
    assert registry_uri("conductor/3") == "models:/conductor/3"
    assert registry_uri("models:/conductor@challenger") == "models:/conductor@challenger"
    with pytest.raises(ModelResolutionError, match="NAME@ALIAS"):
        registry_uri("conductor champion")
    assert ServedModel().id == "conductor/base"
    assert ServedModel(version="3", alias="champion").model_ids() == [
        "conductor",
        "conductor/3",
        "conductor@champion",
    ]


@pytest.fixture
def registered(tmp_path) -> Path:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    client = MlflowClient()
    client.create_registered_model("conductor")
    for _ in range(2):
        version = client.create_model_version("conductor", source=str(adapter))
    client.set_registered_model_alias("conductor", "champion", version.version)
    return adapter


def test_alias_and_version_resolve_to_the_registry_version(registered):
    served = resolve_served_model("conductor@champion", explicit=True)
    assert (served.version, served.alias, served.id) == ("2", "champion", "conductor/2")
    assert served.adapter_dir == str(registered)
    by_version = resolve_served_model("conductor/1", explicit=True)
    assert by_version.version == "1" and by_version.alias is None


def test_explicit_missing_alias_fails_and_the_default_falls_back(registered):
    with pytest.raises(ModelResolutionError, match="conductor@challenger.*does not resolve"):
        resolve_served_model("conductor@challenger", explicit=True)
    assert resolve_served_model("models:/conductor@challenger").version == "base"
    assert resolve_served_model(None).version == "base"


def test_nothing_registered_serves_the_base_policy():
    served = resolve_served_model("models:/conductor@champion", explicit=False)
    assert served.id == "conductor/base" and served.adapter_dir is None


def test_adapter_folder(registered, tmp_path):
    served = resolve_served_model(None, adapter_path=str(registered))
    assert served.version == "adapter" and served.adapter_dir == str(registered)
    with pytest.raises(ModelResolutionError, match="no adapter_config.json"):
        resolve_served_model(None, adapter_path=str(tmp_path))
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelResolutionError, match="but no weights there"):
        resolve_served_model(None, adapter_path=str(tmp_path))


def test_serve_command_line():
    args = build_parser().parse_args(
        ["serve", "--model", "conductor/3", "--policy-server", "vllm", "--max-concurrency", "8"]
    )
    assert (args.model, args.policy_server, args.max_concurrency) == ("conductor/3", "vllm", 8)
    assert args.host is None and args.port is None  # from serving.host / serving.port
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "conductor/3", "--adapter", "x"])
