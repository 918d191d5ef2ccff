"""The registered ``conductor`` model: an ``mlflow.pyfunc`` model wrapping the LoRA adapter.

Why pyfunc rather than ``mlflow.transformers.log_model``: the transformers flavour stores a
PEFT adapter too, but loads it back as a text-generation pipeline tied to a Hub id of the
base model, and needs extra pip-requirement care (stack-notes §4). Here the artifact is the
plain adapter folder (``adapter_config.json``, ``adapter_model.safetensors``, tokenizer and
``conductor_info.json`` with the prompt settings and worker list the Conductor was trained
with), which is exactly what vLLM's ``--lora-modules`` and ``LocalPolicy`` read:

    import mlflow
    model = mlflow.pyfunc.load_model("models:/conductor@champion")
    model.predict({"question": ["What is 2 + 2?"]})          # -> workflow texts
    adapter_dir = model.unwrap_python_model().adapter_dir  # for serving

    # or just the files:
    mlflow.artifacts.download_artifacts("models:/conductor/3")  # .../artifacts/adapter
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

ADAPTER_ARTIFACT = "adapter"


class ConductorModel(mlflow.pyfunc.PythonModel):
    """Input: a ``question`` column (or a list of strings). Output: one workflow text each.

    ``params``: ``temperature`` (default 0: greedy), ``max_tokens`` (default: the training
    completion length), ``seed``. The model computes in ``model_config["dtype"]`` (default
    ``auto``: bfloat16 where the CPU multiplies it in hardware, as ``conductor serve``,
    evaluation and ``conductor ask`` load a local Conductor), so ``predict`` writes the texts
    they write.
    """

    def load_context(self, context: Any) -> None:
        from conductor_pipeline.training.artifacts import ADAPTER_INFO_FILE
        from conductor_pipeline.training.configs import SMOLLM2
        from conductor_pipeline.workflow import LocalPolicy
        from conductor_pipeline.workflow.config import prompt_config

        self.adapter_dir = Path(context.artifacts[ADAPTER_ARTIFACT])
        info = json.loads((self.adapter_dir / ADAPTER_INFO_FILE).read_text())
        config = dict(context.model_config or {})
        base = config.get("base_model_path") or info["base_model"]
        self.info = info
        self.descriptions = list(info["conductor_descriptions"])
        # the conductor.prompt the adapter was trained with
        self.prompt_config = prompt_config(info.get("prompt"))
        self.max_tokens = int(config.get("max_completion_length", 512))
        self.policy = LocalPolicy(
            model_dir=None if base == SMOLLM2 else base,
            adapter_dir=self.adapter_dir,
            dtype=str(config.get("dtype", "auto")),
        )

    # MLflow reads ``model_input``'s annotation when the class is defined (so at every
    # load_model): ``Any`` printed a red warning, none a yellow one; a DataFrame, which is
    # what the registered signature hands over, it takes as is. A dict or a list of strings
    # (``unwrap_python_model().predict``) works too.
    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> list[str]:
        from conductor_pipeline.workflow import conductor_messages

        params = params or {}
        if hasattr(model_input, "columns"):
            questions = [str(q) for q in model_input["question"]]
        elif isinstance(model_input, dict):
            value = model_input["question"]
            questions = [value] if isinstance(value, str) else [str(q) for q in value]
        else:
            questions = [str(q) for q in model_input]
        temperature = float(params.get("temperature", 0.0))
        max_tokens = int(params.get("max_tokens", self.max_tokens))
        seed = int(params.get("seed", 0))
        texts = []
        for question in questions:
            messages = conductor_messages(question, self.descriptions, self.prompt_config)
            completion = asyncio.run(
                self.policy.complete(
                    messages, temperature=temperature, max_tokens=max_tokens, seed=seed
                )
            )
            texts.append(completion.text)
        return texts
