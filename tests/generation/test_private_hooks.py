"""The private torch, transformers and TRL hooks the generation engine relies on are where
``conductor_pipeline.generation``'s docstring says, in the versions it names: an upgrade that
moves one fails here, by name, instead of generating something else silently."""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version

import conductor_pipeline.generation as generation


def test_the_listed_versions_are_the_installed_ones():
    listed = dict(
        re.findall(
            r"(torch|transformers|TRL) (\d+\.\d+\.\d+)", " ".join(generation.__doc__.split())
        )
    )
    installed = {name: version(name.lower()).split("+")[0] for name in listed}
    assert listed == installed, (
        "check the hooks listed in conductor_pipeline/generation/__init__.py against the "
        "installed versions, then update the versions there"
    )


def test_trl_calls_the_overridden_method_and_the_rollout_hook_as_the_trainer_expects():
    from trl import GRPOTrainer

    logps = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
    assert list(logps)[:8] == [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ]
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters
    source = inspect.getsource(GRPOTrainer)
    assert "self.rollout_func(prompts, self)" in source, "TRL calls rollout_func otherwise"
    for attribute in (
        "eos_token_ids",
        "_is_vlm",
        "use_vllm",
        "_entropy_bonus_enabled",
        "chat_template",
        "chat_template_kwargs",
        "temperature",
        "top_p",
        "max_completion_length",
    ):
        assert f"self.{attribute} =" in source, f"GRPOTrainer no longer sets {attribute}"


def test_transformers_keeps_the_cache_and_generation_internals():
    from transformers.cache_utils import Cache, DynamicLayer

    for name in ("lazy_initialization", "batch_select_indices", "crop", "get_seq_length"):
        assert callable(getattr(DynamicLayer, name, None)), f"DynamicLayer.{name}"
    assert "layers" in inspect.signature(Cache.__init__).parameters
    layer = DynamicLayer()
    assert layer.is_initialized is False
