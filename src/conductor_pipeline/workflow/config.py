"""Build orchestration settings and the Conductor policy from the ``conductor`` parameters.

The ``conductor`` mapping (``conf/*/parameters_conductor.yml``) is shared by ``conductor ask``,
training, evaluation and serving, so all of them prompt and sample the Conductor alike::

    conductor:
      policy: {kind: local, model_dir: null, adapter: null}   # or {kind: scripted, worker: 0}
      sampling: {temperature: 0.7, max_tokens: 384, seed: 0}
      max_parse_attempts: 5
      max_rounds: 0
      prompt: {question_to_workers: false, max_steps: 5, positional_access: true}
      budget: {max_steps: 5, max_tokens: null, max_cost_usd: null}
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.workflow.executor import Budget
from conductor_pipeline.workflow.orchestrator import OrchestrationConfig
from conductor_pipeline.workflow.policy import (
    ConductorPolicy,
    EndpointPolicy,
    LocalPolicy,
    ScriptedPolicy,
)
from conductor_pipeline.workflow.prompts import PromptConfig
from conductor_pipeline.workflow.types import ParseLimits

log = logging.getLogger(__name__)

_TOP_KEYS = {"policy", "sampling", "max_parse_attempts", "max_rounds", "prompt", "budget"}
_SECTION_KEYS = {
    "policy": {
        "kind",
        "model_dir",
        "adapter",
        "model",
        "api_base",
        "api_key_env",
        "timeout_s",
        "worker",
        "torch_threads",
        "lookup_tokens",
        "dtype",
    },
    "sampling": {"temperature", "max_tokens", "seed"},
    # every PromptConfig field except the descriptions, which come from the pool
    "prompt": set(PromptConfig.__dataclass_fields__) - {"worker_descriptions"},
    "budget": {"max_steps", "max_tokens", "max_cost_usd"},
}


def _section(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    section = params.get(name) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"conductor.{name}: must be a mapping")
    check_keys(f"conductor.{name}", section, _SECTION_KEYS[name])
    return dict(section)


def prompt_config(section: Mapping[str, Any] | None) -> PromptConfig:
    """``PromptConfig`` from ``conductor.prompt``; training builds its prompts from it too.

    ``few_shot``: a list of examples, ``[]`` for none, or null / ``default`` for the
    built-in worked examples.
    """
    prompt = _section({"prompt": section}, "prompt")
    if prompt.get("few_shot") in (None, "default"):
        prompt.pop("few_shot", None)
    try:
        return PromptConfig(**prompt)
    except (TypeError, ValueError) as err:
        raise ValueError(f"conductor.prompt: {err}") from err


def orchestration_config(params: Mapping[str, Any]) -> OrchestrationConfig:
    """``OrchestrationConfig`` from the ``conductor`` mapping; errors name the bad key."""
    check_keys("conductor", params, _TOP_KEYS)
    sampling, budget = (_section(params, name) for name in ("sampling", "budget"))
    _section(params, "policy")
    prompt = prompt_config(params.get("prompt"))
    try:
        return OrchestrationConfig(
            temperature=float(sampling.get("temperature", 0.7)),
            max_tokens=int(sampling.get("max_tokens", 384)),
            seed=int(sampling.get("seed", 0)),
            max_parse_attempts=int(params.get("max_parse_attempts", 5)),
            max_rounds=int(params.get("max_rounds", 0)),
            prompt=prompt,
            limits=ParseLimits(max_steps=prompt.max_steps),
            budget=Budget(
                max_steps=budget.get("max_steps"),
                max_tokens=budget.get("max_tokens"),
                max_cost_usd=budget.get("max_cost_usd"),
            ),
        )
    except (TypeError, ValueError) as err:
        raise ValueError(f"conductor: {err}") from err


def build_policy(policy: Mapping[str, Any], *, adapter_dir: str | None = None) -> ConductorPolicy:
    """The Conductor model named by ``conductor.policy``.

    ``kind: scripted`` is the rule-based :class:`ScriptedPolicy` (one step to worker
    ``worker`` with the question as subtask): a baseline and a deterministic stand-in for
    tests and load benchmarks, not a trained Conductor.

    ``adapter_dir`` is a resolved local LoRA folder (the caller resolves registry references
    such as ``models:/conductor@champion``, which need MLflow). An ``endpoint`` cannot load
    it: the server answers with whatever it serves as ``model``, so a caller that must reach
    one adapter serves it under its own name and asks for that name (the evaluation
    pipeline's ``policy_server: vllm`` does); passing one here only logs a warning.
    """
    kind = policy.get("kind", "local")
    if kind == "local":
        threads = policy.get("torch_threads")
        return LocalPolicy(
            model_dir=policy.get("model_dir"),
            adapter_dir=adapter_dir,
            torch_threads=int(threads) if threads else None,
            lookup_tokens=policy.get("lookup_tokens", 8),
            dtype=policy.get("dtype", "auto"),
        )
    if kind == "endpoint":
        for key in ("model", "api_base"):
            if not policy.get(key):
                raise ValueError(f"conductor.policy.{key}: required for an endpoint policy")
        if adapter_dir is not None:
            log.warning(
                "conductor.policy: the endpoint %s answers with what it serves as %s; the "
                "adapter %s is not loaded by this process",
                policy["api_base"],
                policy["model"],
                adapter_dir,
            )
        key_env = policy.get("api_key_env")
        return EndpointPolicy(
            model=policy["model"],
            api_base=policy["api_base"],
            api_key=os.environ.get(key_env) if key_env else None,
            timeout_s=float(policy.get("timeout_s", 120)),
        )
    if kind == "scripted":
        # a fixed rule, not a model (a baseline and a test fixture); adapters do not apply
        try:
            return ScriptedPolicy(worker=policy.get("worker", 0))
        except ValueError as err:
            raise ValueError(f"conductor.policy.worker: {err}") from err
    raise ValueError(
        f"conductor.policy.kind: must be 'local', 'endpoint' or 'scripted', got {kind!r}"
    )
