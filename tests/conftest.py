"""Test configuration: offline by default, and never the project's own MLflow store."""

from __future__ import annotations

import os
from pathlib import Path

from conductor_pipeline.offline import OFFLINE_DEFAULTS

# Set before any test module imports litellm, transformers, datasets or kedro (forced, not
# defaulted: a developer's HF_HUB_OFFLINE=0 must not reach the tests).
os.environ.update(OFFLINE_DEFAULTS)
# One plain copy of SmolLM2 for the whole session (the checkout's, as `make run` makes it):
# project copies would otherwise each convert the GGUF again, ~20 s apiece on 2 cores.
# Tests of the conversion itself set their own folder.
os.environ.setdefault(
    "CONDUCTOR_MODEL_CACHE",
    str(Path(__file__).resolve().parents[1] / "data" / "06_models" / "smollm2-135m-instruct"),
)

# Two test processes share the machine's cores (make test: pytest -n 2), and each test's
# subprocesses (kedro runs, servers) run beside them: torch's default, one OpenMP thread per
# core in every process, oversubscribes the cores, and OpenMP's spinning threads burn what
# the other processes need. Tests that need more threads set their own count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_mlflow_store(tmp_path_factory, monkeypatch):
    """Each test that touches MLflow without choosing a store gets a throw-away one."""
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        # a run left open (e.g. by an in-process Kedro session) would be adopted by the next test
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(f"sqlite:///{store}")  # undo the test's or kedro-mlflow's choice


@pytest.fixture(autouse=True)
def default_registered_model():
    """An in-process `--env gpu` session makes its registered model the process's
    (registry.use_registered_model); the next test starts from the default again."""
    yield
    from conductor_pipeline.registry import use_registered_model

    use_registered_model(None)


@pytest.fixture(autouse=True)
def root_logging_restored():
    """`conductor`'s CLI, run in-process, sets up the root logger for a command line
    (a stderr handler, INFO with --verbose); the next test starts from the logging it had,
    so that a server some later test leaves running prints no stray access lines."""
    import logging

    from conductor_pipeline.stderr_logging import StderrHandler

    root = logging.getLogger()
    level, before = root.level, set(root.handlers)
    yield
    for handler in list(root.handlers):
        if isinstance(handler, StderrHandler) and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)


# -- a tiny random policy model, shared by the training and evaluation tests --------------


def smollm2_tokenizer():
    """SmolLM2's tokenizer: from the plain-copy cache if present, else from the GGUF."""
    from conductor_pipeline.workers.local_model import (
        cache_complete,
        default_cache_dir,
        load_pretrained_tokenizer,
        smollm2_gguf_path,
    )

    cache = default_cache_dir()
    if cache_complete(cache):
        return load_pretrained_tokenizer(cache)
    gguf = smollm2_gguf_path()
    return load_pretrained_tokenizer(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 6.4M-parameter random LlamaForCausalLM + SmolLM2 tokenizer (stack-notes §9)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = smollm2_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
