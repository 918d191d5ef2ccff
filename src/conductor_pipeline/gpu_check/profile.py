"""The shapes the GPU profile trains at, read from ``conf/base`` and ``conf/gpu``.

Read with PyYAML only (no Kedro, no project imports), so that a bare GPU image runs it:
``conf/gpu``'s ``training`` section is soft-merged over ``conf/base``'s, key by key, as the
project's configuration loader does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TRAINING_FILE = "parameters_training.yml"


@dataclass(frozen=True)
class LoraShape:
    r: int
    alpha: int
    dropout: float
    targets: tuple[str, ...]


@dataclass(frozen=True)
class RunShape:
    """What the check measures: the profile's shapes unless an option scaled one down."""

    prompts: int
    group: int
    micro_batch: int
    prompt_tokens: int
    completion_tokens: int
    steps: int
    lora: LoraShape
    gradient_checkpointing: bool
    loss_type: str
    use_vllm: bool
    vllm_gpu_memory_utilization: float

    @property
    def rows_per_step(self) -> int:
        return self.prompts * self.group

    def scaled_down(self, profile: ProfileShapes) -> list[str]:
        """The settings below the profile's that change memory per micro-batch (the number
        of prompts and completions per step only changes the step's length)."""
        pairs = {
            "micro_batch": (self.micro_batch, profile.micro_batch_size),
            "prompt_tokens": (self.prompt_tokens, profile.max_prompt_tokens),
            "completion_tokens": (self.completion_tokens, profile.max_completion_length),
            "lora_r": (self.lora.r, profile.lora_r),
        }
        return [name for name, (ours, theirs) in pairs.items() if ours < theirs]


@dataclass(frozen=True)
class ProfileShapes:
    """What one GPU-profile training run does per step, and for how many steps."""

    base_model: str
    max_prompt_tokens: int
    max_completion_length: int
    num_generations: int
    prompts_per_step: int
    micro_batch_size: int
    max_steps: int
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_targets: list[str] = field(default_factory=list)
    bf16: bool = True
    gradient_checkpointing: bool = True
    use_vllm: bool = True
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    loss_type: str = "bnpo"
    beta: float = 0.0

    @property
    def rows_per_step(self) -> int:
        """Completions generated and trained on per optimizer step."""
        return self.prompts_per_step * self.num_generations

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _training_section(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise FileNotFoundError(
            f"gpu-check reads the GPU profile's training settings from {path}, which does not "
            "exist; run it from the project's checkout or pass --conf DIR (the folder holding "
            "base/ and gpu/)"
        )
    loaded = yaml.safe_load(path.read_text()) or {}
    return dict(loaded.get("training") or {})


def default_conf_root() -> Path:
    """The checkout's ``conf`` folder (this file lives in ``src/conductor_pipeline/...``),
    else the working directory's (an installed copy)."""
    checkout = Path(__file__).resolve().parents[3] / "conf"
    return checkout if checkout.is_dir() else Path.cwd() / "conf"


def load_profile(conf_root: Path | None = None, env: str = "gpu") -> ProfileShapes:
    """``training`` of ``conf/<env>`` over ``conf/base``, as the shapes a run trains at."""
    root = conf_root or default_conf_root()
    training = _merge(
        _training_section(root / "base" / TRAINING_FILE),
        _training_section(root / env / TRAINING_FILE),
    )
    grpo, lora = dict(training.get("grpo") or {}), dict(training.get("lora") or {})
    generations = int(grpo["num_generations"])
    prompts = int(grpo.get("prompts_per_step", 1))
    return ProfileShapes(
        base_model=str(training["base_model"]),
        max_prompt_tokens=int(training["max_prompt_tokens"]),
        max_completion_length=int(grpo["max_completion_length"]),
        num_generations=generations,
        prompts_per_step=prompts,
        micro_batch_size=int(grpo.get("micro_batch_size") or generations * prompts),
        max_steps=int(grpo["max_steps"]),
        lora_r=int(lora["r"]),
        lora_alpha=int(lora["alpha"]),
        lora_dropout=float(lora.get("dropout", 0.0)),
        lora_targets=list(lora["target_modules"]),
        bf16=bool(grpo.get("bf16", True)),
        gradient_checkpointing=bool(grpo.get("gradient_checkpointing", True)),
        use_vllm=bool(grpo.get("use_vllm", False)),
        vllm_mode=str(grpo.get("vllm_mode", "colocate")),
        vllm_gpu_memory_utilization=float(grpo.get("vllm_gpu_memory_utilization", 0.3)),
        loss_type=str(grpo.get("loss_type", "bnpo")),
        beta=float(grpo.get("beta", 0.0)),
    )
