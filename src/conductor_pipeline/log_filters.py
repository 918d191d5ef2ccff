"""Known, understood noise of ``kedro run``, dropped one message at a time.

Used twice: as a filter on the console handler of ``conf/base/logging.yml`` (the Makefile
points Kedro at it, so that it applies from the first log line, before any project code
runs: kedro-mlflow's import makes MLflow warn) and on the loggers of ``settings.py`` (for
``kedro run`` without the Makefile, and for libraries with their own handlers). Imports
nothing but ``logging``: Kedro loads it while it configures logging.
"""

from __future__ import annotations

import logging

__all__ = ["KNOWN_NOISE", "KnownNoise"]

# Each entry: fragments that must all occur in a record's message for it to be dropped.
KNOWN_NOISE: tuple[tuple[str, ...], ...] = (
    # kedro's and kedro-mlflow's own calls (not ours) of an OmegaConf API deprecated in 2.4
    ("register_new_resolver() is deprecated",),
    # MLflow's advice on predict() type hints, for kedro-mlflow's pipeline model and for
    # ConductorModel, which pass an explicit signature (what MLflow validates against).
    # MLflow raises these inside its own catch_warnings("once"), past any warnings filter.
    ("Add type hints to the `predict` method",),
    ("Type hint used in the model's predict function is not supported",),
    ("Failed to infer signature from type hint",),
    # an input example would make MLflow load the 135M policy and run it at registration
    ("An input example was not provided when logging the model",),
    # the registered model is a PythonModel object by design (training/mlflow_model.py)
    ("Passing a Python object as `python_model`",),
    # litellm's async logging worker is a task on the event loop of whichever asyncio.run
    # first logged a call; when that loop closes, asyncio reports the pending task at ERROR,
    # although litellm starts a new worker on the next loop and nothing is lost (the
    # project registers no litellm callbacks)
    ("Task was destroyed but it is pending", "LoggingWorker"),
    # SmolLM2's tokenizer declares another EOS id than the model config; the trainers align
    # them (the intended behaviour) and say so on every stage
    ("The tokenizer has new PAD/BOS/EOS tokens",),
    # tqdm.auto, imported by MLflow (kedro-mlflow's hook), asks for ipywidgets in any
    # IPython kernel without it; its text bar works there, and the project shows no widget
    ("IProgress not found",),
    # kedro-mlflow announces the resolver it registers when each Kedro context is made
    # (its own logger is at INFO, so a level in logging.yml would also hide its run notices)
    ("Registering new custom resolver: 'km.random_name'",),
)


class KnownNoise(logging.Filter):
    """Drops a record whose message matches one of :data:`KNOWN_NOISE`; keeps the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to drop
            return True
        return not any(all(part in message for part in parts) for parts in KNOWN_NOISE)
