"""An adapter is mounted only on the base model it was trained on, at every mount point."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from conductor_pipeline.workflow.adapter_base import (
    AdapterBaseMismatch,
    adapter_base_model,
    check_adapter_base,
    same_base_model,
)

QWEN = "Qwen/Qwen2.5-7B-Instruct"


def _adapter(folder: Path, base: str | None) -> Path:
    folder.mkdir(parents=True)
    config = {"r": 8, "peft_type": "LORA"}
    if base is not None:
        config["base_model_name_or_path"] = base
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def smollm2_adapter(tmp_path) -> Path:
    """What the sandbox registers: base model recorded relative to the project root."""
    return _adapter(tmp_path / "smol", "data/06_models/smollm2-135m-instruct")


def test_names_of_one_model_match_and_others_do_not(tmp_path):
    assert same_base_model("data/06_models/smollm2-135m-instruct", "smollm2-135m-instruct")
    assert same_base_model("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct")
    assert same_base_model("/models/qwen2.5-7b-instruct/", QWEN)
    assert not same_base_model("data/06_models/smollm2-135m-instruct", QWEN)
    assert not same_base_model("Qwen/Qwen2.5-1.5B-Instruct", QWEN)
    copy = tmp_path / "my-copy"
    copy.mkdir()
    assert same_base_model(str(copy), "my-copy", root=tmp_path)
    assert same_base_model("my-copy", str(copy), root=tmp_path)


def test_the_refusal_names_the_adapter_and_both_models(smollm2_adapter):
    with pytest.raises(AdapterBaseMismatch) as caught:
        check_adapter_base(
            smollm2_adapter, QWEN, where="conductor serve", label="models:/conductor@champion"
        )
    message = str(caught.value)
    for part in (
        "conductor serve",
        "models:/conductor@champion",
        str(smollm2_adapter),
        "data/06_models/smollm2-135m-instruct",
        QWEN,
    ):
        assert part in message, part
    check_adapter_base(smollm2_adapter, "smollm2-135m-instruct", where="x")  # the same model


def test_an_adapter_that_does_not_say_is_mounted_with_a_warning(tmp_path, caplog):
    folder = _adapter(tmp_path / "old", None)
    assert adapter_base_model(folder) is None
    with caplog.at_level(logging.WARNING):
        check_adapter_base(folder, QWEN, where="x")
    assert "does not record its base model" in caplog.text


def test_the_local_policy_refuses_an_adapter_of_another_base_model(tmp_path, smollm2_adapter):
    from conductor_pipeline.workflow.policy import LocalPolicy

    qwen_adapter = _adapter(tmp_path / "qwen", QWEN)
    with pytest.raises(AdapterBaseMismatch, match="Qwen2.5-7B-Instruct"):
        LocalPolicy(adapter_dir=qwen_adapter)  # the default base: SmolLM2
    with pytest.raises(AdapterBaseMismatch, match="smollm2-135m-instruct"):
        LocalPolicy(model_dir="/models/Qwen2.5-7B-Instruct", adapter_dir=smollm2_adapter)
    assert LocalPolicy(adapter_dir=smollm2_adapter).adapter_dir == smollm2_adapter


def test_the_vllm_launch_refuses_an_adapter_of_another_base_model(tmp_path, smollm2_adapter):
    """Serving (one adapter) and evaluation (several named ones) launch through the same
    policy server: a SmolLM2 adapter never reaches `vllm serve Qwen/...`."""
    from conductor_pipeline.serving.policy_server import VllmPolicyServer, VllmSettings

    settings = VllmSettings(base_model=QWEN, executable="vllm")
    with pytest.raises(AdapterBaseMismatch, match=r"vLLM LoRA 'conductor'"):
        VllmPolicyServer(settings, smollm2_adapter)
    qwen_adapter = _adapter(tmp_path / "qwen", QWEN)
    with pytest.raises(AdapterBaseMismatch, match=r"conductor-v1"):
        VllmPolicyServer(
            settings,
            None,
            lora_modules={"conductor-v2": qwen_adapter, "conductor-v1": smollm2_adapter},
        )
    server = VllmPolicyServer(settings, None, lora_modules={"conductor-v2": qwen_adapter})
    assert f"conductor-v2={qwen_adapter}" in server.argv


def test_training_refuses_to_continue_from_an_adapter_of_another_base_model(smollm2_adapter):
    from conductor_pipeline.pipelines.training import nodes
    from conductor_pipeline.training.models import with_adapter

    with pytest.raises(AdapterBaseMismatch, match="training start_from"):
        nodes.resolve_start_adapter(str(smollm2_adapter), QWEN)
    assert nodes.resolve_start_adapter(str(smollm2_adapter), "smollm2-135m-instruct") == str(
        smollm2_adapter
    )
    loaded_qwen = SimpleNamespace(name_or_path="/models/Qwen2.5-7B-Instruct")
    with pytest.raises(AdapterBaseMismatch, match="training"):
        with_adapter(loaded_qwen, smollm2_adapter)
