"""The policy under test: where its weights come from (a folder, the Hugging Face cache, or
its architecture with random weights), its LoRA shape and the prompts it is given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.gpu_check.profile import LoraShape

# Architectures the check can build with random weights when their weights are absent
# (``--random-init``); step time and memory depend on the shapes, not on the values.
QWEN2_5_7B_INSTRUCT_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
}
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
KNOWN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": QWEN2_5_7B_INSTRUCT_CONFIG,
    "HuggingFaceTB/SmolLM2-135M-Instruct": SMOLLM2_135M_CONFIG,
}

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
# filler standing in for the Conductor's system prompt (rules, worker list, worked examples):
# prompts are cut or repeated to exactly the measured length
FILLER = (
    " You coordinate a pool of worker models. Write a workflow: the list of workers to call,"
    " the subtask for each, and which earlier steps each may see."
)


class ModelUnavailable(RuntimeError):
    """The weights to measure are not on this machine (the check never downloads)."""


@dataclass
class ModelSource:
    """Where the policy comes from: a folder to load, or an architecture to build."""

    kind: str  # "folder", "hf-cache" or "random-init"
    name: str
    folder: Path | None
    tokenizer_folder: Path | None
    note: str
    config: dict[str, Any] | None = None  # random-init only


def _cached_snapshot(model: str) -> Path | None:
    """The Hugging Face cache's snapshot folder of ``model`` when its config is there."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        hit = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id is simply not cached
        return None
    return Path(hit).parent if isinstance(hit, str) else None


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def _has_tokenizer(folder: Path | None) -> bool:
    return folder is not None and (folder / "tokenizer_config.json").is_file()


def resolve_model_source(
    model: str, tokenizer: Path | None = None, random_init: bool = False
) -> ModelSource:
    """``model`` (a folder or a Hugging Face id) as a source to measure. Its weights must
    be on this machine unless ``random_init``, which builds its architecture (from its
    cached config.json, else :data:`KNOWN_ARCHITECTURES`) with random weights."""
    path = Path(model).expanduser()
    folder = path if path.is_dir() else _cached_snapshot(model)
    if random_init:
        config = None
        if folder is not None and (folder / "config.json").is_file():
            import json

            config = json.loads((folder / "config.json").read_text())
        config = config or KNOWN_ARCHITECTURES.get(model)
        if config is None:
            raise ModelUnavailable(
                f"--random-init: no architecture known for {model!r} (no config.json in a "
                f"folder or the Hugging Face cache, and not one of {sorted(KNOWN_ARCHITECTURES)})"
            )
        tok = tokenizer or (folder if _has_tokenizer(folder) else None)
        return ModelSource(
            "random-init",
            model,
            None,
            tok,
            f"{model}'s architecture with random weights (--random-init): step time and "
            "memory depend on the shapes only",
            config,
        )
    if folder is not None and _has_weights(folder):
        kind = "folder" if path.is_dir() else "hf-cache"
        return ModelSource(kind, model, folder, tokenizer or folder, f"loaded from {folder}")
    where = "a folder without weights" if folder else "not a folder, not in the HF cache"
    raise ModelUnavailable(
        f"the weights of {model} are not on this machine ({where}); "
        "gpu-check never downloads. Download them first (`huggingface-cli download "
        f"{model}`), or pass --model with a folder or cached id that has them, or "
        "--random-init to measure the architecture with random weights (add --tokenizer DIR "
        "for TRL's path). A smaller --model measures a different run than the profile's."
    )


def build_random_model(config: dict[str, Any], device: str = "cpu", dtype: Any = None) -> Any:
    """A causal LM with ``config``'s shapes and seeded random weights, built directly on
    ``device`` (a 7B model initialised on the CPU would take minutes)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = values.pop("model_type")
    values.pop("architectures", None)
    values.pop("torch_dtype", None)
    values.pop("transformers_version", None)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(
            AutoConfig.for_model(model_type, **values), dtype=dtype or torch.float32
        )


def materialise_model(source: ModelSource, workdir: Path, device: str, dtype_name: str) -> Path:
    """A folder holding the model (and tokenizer when known): TRL's colocated vLLM and vLLM
    itself load by path, so random weights are saved once into ``workdir``."""
    if source.folder is not None:
        return source.folder
    import torch

    assert source.config is not None
    folder = workdir / "policy"
    model = build_random_model(source.config, device, getattr(torch, dtype_name))
    model.save_pretrained(folder)
    del model
    if source.tokenizer_folder is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(source.tokenizer_folder).save_pretrained(folder)
    return folder


def load_tokenizer(folder: Path | None) -> Any | None:
    """The tokenizer in ``folder``, or ``None`` (then prompts are token ids)."""
    if not _has_tokenizer(folder):
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


def lora_config(shape: LoraShape) -> Any:
    """PEFT's ``LoraConfig`` for ``shape`` (the GPU profile's unless scaled down)."""
    from peft import LoraConfig

    return LoraConfig(
        r=shape.r,
        lora_alpha=shape.alpha,
        lora_dropout=shape.dropout,
        target_modules=list(shape.targets),
        task_type="CAUSAL_LM",
    )


def load_policy(folder: Path, device: str, dtype_name: str, lora: LoraShape) -> tuple[Any, Any]:
    """``(base model, LoRA-wrapped policy)`` on ``device`` in ``dtype_name``."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
    policy = get_peft_model(base, lora_config(lora))
    return base, policy


def count_parameters(model: Any) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": int(total), "trainable_parameters": int(trainable)}
