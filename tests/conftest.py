"""Test configuration: offline by default, and never the project's own MLflow store."""

from __future__ import annotations

import os

# Set before any test module imports litellm, transformers, datasets or kedro.
_OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "KEDRO_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
os.environ.update(_OFFLINE)
