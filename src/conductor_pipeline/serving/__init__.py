"""Serving the Conductor: the policy server launcher (vLLM on GPU, transformers in process on
CPU) and the Conductor API, an OpenAI-compatible chat endpoint whose answers come from
orchestrated workflows. ``conductor serve`` runs both; see docs/serving.md.

Heavy modules (FastAPI, uvicorn, MLflow) load only when the app or server is used.
"""

from conductor_pipeline.serving.models import (
    ModelResolutionError,
    ServedModel,
    resolve_served_model,
)
from conductor_pipeline.serving.policy_server import (
    PolicyServerError,
    VllmPolicyServer,
    VllmSettings,
    build_vllm_command,
    ensure_vllm_available,
)
from conductor_pipeline.serving.settings import RequestLimits, ServingSettings, serving_settings

__all__ = [
    "ModelResolutionError",
    "PolicyServerError",
    "RequestLimits",
    "ServedModel",
    "ServingSettings",
    "VllmPolicyServer",
    "VllmSettings",
    "build_vllm_command",
    "ensure_vllm_available",
    "resolve_served_model",
    "serving_settings",
]
