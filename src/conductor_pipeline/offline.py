"""Offline by default: the environment variables that keep Hugging Face, LiteLLM and Kedro
from reaching the network (stack-notes §2).

Applied with ``setdefault`` by the Kedro settings (so ``kedro run``, ``kedro jupyter`` and
``%load_ext kedro.ipython`` get them) and by the ``conductor`` command; a value the user set,
e.g. ``HF_HUB_OFFLINE=0`` to download a GPU base model, is left alone.
"""

from __future__ import annotations

import os

OFFLINE_DEFAULTS: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else every `import litellm` fetches a price map
    "KEDRO_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply_offline_defaults() -> None:
    """Set each offline variable the environment does not set already."""
    for name, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(name, value)
