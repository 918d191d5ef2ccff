"""The recursion fine-tune with vLLM generation (the GPU profile's ``use_vllm``) is refused
before anything is trained: it would start a second trainer with a second (colocated) vLLM
engine and write round 1 with transformers' ``generate`` on the full model. No CUDA needed:
the check comes before any model is loaded."""

from __future__ import annotations

import pytest

from conductor_pipeline.training.configs import TrainingConfig
from conductor_pipeline.training.grpo import check_recursion_generation, train_conductor
from conductor_pipeline.training.inputs import PoolInfo
from tests.training.fakes import FakePool, make_task


def _config(out, *, recursion: bool, vllm_mode: str = "colocate") -> TrainingConfig:
    return TrainingConfig.from_params(
        {
            "base_model": "no/such-model",  # never loaded: the refusal comes first
            "output_dir": str(out),
            "grpo": {
                "num_generations": 4,
                "prompts_per_step": 1,
                "max_steps": 1,
                "learning_rate": 1e-4,
                "use_vllm": True,
                "vllm_mode": vllm_mode,
            },
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "sft": {"enabled": False},
            "recursion": {"enabled": recursion, "max_steps": 1},
        }
    )


@pytest.mark.parametrize("vllm_mode", ["colocate", "server"])
def test_recursion_with_vllm_is_refused_before_training(tmp_path, vllm_mode):
    tasks = [make_task(i) for i in range(2)]
    pool = FakePool(tasks)
    info = PoolInfo(pool, pool.names, pool.descriptions, pool.prices)
    config = _config(tmp_path / "out", recursion=True, vllm_mode=vllm_mode)
    with pytest.raises(ValueError) as caught:
        train_conductor(tasks, info, config)
    message = str(caught.value)
    assert "training.recursion.enabled" in message
    assert "training.grpo.use_vllm" in message
    assert not (tmp_path / "out").exists()  # refused before a run folder or a model


def test_vllm_without_recursion_is_not_refused_by_that_check(tmp_path):
    check_recursion_generation(_config(tmp_path / "out", recursion=False))
