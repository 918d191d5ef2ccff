"""Kedro project settings: https://docs.kedro.org/en/stable/kedro_project_setup/settings.html"""

from conductor_pipeline.offline import apply_offline_defaults

apply_offline_defaults()  # `kedro run` / `kedro jupyter` without the Makefile stay offline too

import logging  # noqa: E402
import warnings  # noqa: E402


class _DropMessages(logging.Filter):
    """Drops records whose message contains every fragment of one of ``patterns``."""

    def __init__(self, *patterns: tuple[str, ...]) -> None:
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(all(part in message for part in p) for p in self.patterns)


# Known, understood noise of `kedro run`, silenced one message at a time (anything else from
# the same sources still shows):
_QUIET_WARNINGS = (
    # kedro's and kedro-mlflow's own calls (not ours) of an OmegaConf API deprecated in 2.4
    r"register_new_resolver\(\) is deprecated",
    # MLflow's advice on predict() type hints: ConductorModel and kedro-mlflow's pipeline
    # model pass an explicit signature, which is what MLflow validates against. The messages
    # start with ANSI colour codes, hence ".*".
    r".*Add type hints to the `predict` method",
    r".*Type hint used in the model's predict function is not supported",
    r"Failed to infer signature from type hint",
    # an input example would make MLflow load the 135M policy and run it at registration
    r".*An input example was not provided when logging the model",
)
_QUIET_LOGS = {
    # litellm's async logging worker is a task on the event loop of whichever asyncio.run
    # first logged a call; when that loop closes the pending task is reported at ERROR,
    # although litellm recreates the worker on the next loop and nothing is lost (the
    # project registers no litellm callbacks)
    "asyncio": _DropMessages(("Task was destroyed but it is pending", "LoggingWorker")),
    # the registered model is a PythonModel object by design (mlflow_model.py)
    "mlflow.pyfunc": _DropMessages(("Passing a Python object as `python_model`",)),
    # SmolLM2's tokenizer declares its EOS token, the model config another id; the trainers
    # align them (the intended behaviour) and say so on every stage
    "transformers.trainer_utils": _DropMessages(("The tokenizer has new PAD/BOS/EOS tokens",)),
    # SmolLM2's tokenizer_config asks for clean_up_tokenization_spaces, which transformers
    # rightly skips for a BPE tokenizer
    "transformers.tokenization_utils_tokenizers": _DropMessages(
        ("Ignoring clean_up_tokenization_spaces=True for BPE tokenizer",)
    ),
}


def quiet_known_noise() -> None:
    """Install the narrow warning and log filters above (idempotent)."""
    for message in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    for name, drop in _QUIET_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(drop)


quiet_known_noise()

from kedro.config import OmegaConfigLoader  # noqa: E402

from conductor_pipeline.distributed import is_main_process  # noqa: E402
from conductor_pipeline.hooks import MlflowRunHooks, ProjectHooks  # noqa: E402
from conductor_pipeline.paths import project_root  # noqa: E402
from conductor_pipeline.pipelines.data_prep.preflight import SetupErrorHooks  # noqa: E402
from conductor_pipeline.run_summary import RunSummaryHooks  # noqa: E402


def _project_root_resolver(*_: str) -> str:
    # OmegaConf resolvers are called with the (empty) argument list of ``${project_root:}``
    return project_root().as_posix()


HOOKS = (ProjectHooks(), MlflowRunHooks(), RunSummaryHooks(), SetupErrorHooks())

# Several processes (`accelerate launch --num_processes N -m kedro run`): only the main one
# opens the kedro-mlflow run; the others log nothing (one run per `kedro run`, not N).
if not is_main_process():
    DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow",)

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    "custom_resolvers": {"project_root": _project_root_resolver},
    "config_patterns": {
        "mlflow": ["mlflow*", "mlflow*/**"],
        "workers": ["workers*", "workers*/**"],
    },
}
