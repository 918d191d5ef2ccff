"""An endpoint Conductor is labelled as what it is: the version whose adapter it serves
(``evaluation.policy_server: vllm``), or else the endpoint itself, never a registry version
it cannot load. The end-to-end run is tests/test_gpu_profile.py."""

from __future__ import annotations

import json

import pytest

from conductor_pipeline.evaluation import EvaluationConfig, conductors

ENDPOINT = {
    "policy": {
        "kind": "endpoint",
        "model": "hosted_vllm/conductor",
        "api_base": "http://127.0.0.1:9/v1",
    }
}
SERVING = {"vllm": {"base_model": "Qwen/Qwen2.5-7B-Instruct", "executable": "vllm", "port": 9}}


@pytest.fixture
def adapter(tmp_path):
    folder = tmp_path / "adapter"
    (folder / "warm_start").mkdir(parents=True)
    for each in (folder, folder / "warm_start"):
        (each / "adapter_config.json").write_text(json.dumps({"r": 8}))
        (each / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_an_endpoint_not_launched_by_the_evaluation_is_labelled_as_the_endpoint(adapter):
    config = EvaluationConfig.from_params(
        {"conductor": {"adapter": str(adapter)}, "systems": ["conductor"]}
    )
    conductor, _ = conductors.build_policies(ENDPOINT, config)
    assert conductor.variant == "endpoint:hosted_vllm/conductor"
    assert "adapter" not in conductor.label
    assert conductors.champion_policy(conductor, ENDPOINT, config) is None


def test_the_launched_server_serves_each_adapter_under_its_own_name(adapter, monkeypatch):
    from conductor_pipeline.serving.models import ServedModel

    champion_dir = adapter.parent / "champion"
    champion_dir.mkdir()
    (champion_dir / "adapter_config.json").write_text(json.dumps({"r": 16}))
    (champion_dir / "adapter_model.safetensors").write_bytes(b"")
    champion = ServedModel(
        version="1",
        registered_name="conductor",
        alias="champion",
        reference="models:/conductor@champion",
        adapter_dir=str(champion_dir),
    )
    monkeypatch.setattr(conductors, "_champion", lambda: champion)
    config = EvaluationConfig.from_params(
        {
            "policy_server": "vllm",
            "conductor": {"adapter": str(adapter)},
            "systems": ["conductor", "champion", "warm-start", "base-policy"],
        }
    )
    plan = conductors.served_conductors(ENDPOINT, config, SERVING)
    digest = plan.conductor.variant.split(":")[1]
    assert plan.conductor.variant.startswith("adapter:")
    assert plan.champion.variant == "conductor/1"
    assert plan.served_names == {
        "conductor": f"conductor-adapter-{digest}",
        "champion": "conductor-v1",
        "warm-start": f"conductor-adapter-{digest}-warm-start",
        "base-policy": "conductor-base",
    }
    argv = plan.server.argv
    assert f"conductor-v1={champion_dir}" in argv
    assert f"conductor-adapter-{digest}={adapter}" in argv
    assert argv[argv.index("--served-model-name") + 1] == "conductor-base"
    # the endpoints reach the launched server, not conductor.policy.api_base
    assert plan.base.policy.api_base == "http://127.0.0.1:9/v1"


def test_policy_server_setting_is_checked():
    with pytest.raises(ValueError, match="evaluation.policy_server"):
        EvaluationConfig.from_params({"policy_server": "sglang"})
    assert EvaluationConfig.from_params({}).policy_server == "none"
