"""GPU-heavy stages in processes of their own (``stages.training.own_process``, conf/gpu).

The stage functions below are stand-ins run by :func:`run_in_own_process` in a fresh
``spawn`` child (which imports them from this module). The last test runs the real training
node on a tiny model, once in its own process from a fresh interpreter and once in-process,
and compares what they return.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor_pipeline.setup_errors import SetupError, find_setup_error
from conductor_pipeline.stage_process import StageProcessError, run_in_own_process

REPO = Path(__file__).resolve().parents[1]

# what a stage that frees nothing leaves behind in the process it ran in
_HELD: list = []


def _hold_a_model(rows: int) -> dict:
    import torch

    model = torch.nn.Linear(rows, rows)
    _HELD.append(model)  # like a trainer nothing frees: alive until the process ends
    logging.getLogger("conductor_pipeline.stage_test").info("model built")
    return {"pid": os.getpid(), "held": len(_HELD), "parameters": model.weight.numel()}


def _fail_with_setup_error() -> None:
    try:
        raise KeyError("OPENAI_API_KEY")
    except KeyError as err:
        raise SetupError("a worker's key is missing", "put it in credentials.yml") from err


class _Unbuildable(Exception):
    def __init__(self, handle) -> None:
        super().__init__("holds a lock")
        self.handle = handle


def _fail_with_an_unpicklable_error() -> None:
    import threading

    raise _Unbuildable(threading.Lock())


def _return_a_lock():
    import threading

    return threading.Lock()


def _return_but_never_exit() -> int:
    import threading
    import time

    threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: blocks exit
    return os.getpid()


def _die() -> None:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_stage_in_its_own_process_leaves_nothing_it_held_here(caplog):
    caplog.set_level(logging.INFO, logger="conductor_pipeline.stage_test")
    result = run_in_own_process("training", _hold_a_model, 64)
    assert result["pid"] != os.getpid() and result["parameters"] == 64 * 64
    assert result["held"] == 1 and _HELD == []  # the model lived and died in the child
    assert multiprocessing.active_children() == []  # the child has exited
    # its log records reached this process's loggers, marked with the child's pid
    built = [r for r in caplog.records if r.getMessage() == "model built"]
    assert [r.process for r in built] == [result["pid"]]


def test_an_error_in_the_stage_is_raised_here_with_its_type_and_traceback():
    with pytest.raises(SetupError) as raised:
        run_in_own_process("training", _fail_with_setup_error)
    error = raised.value
    assert error.fix == "put it in credentials.yml"  # rebuilt with its attributes
    assert find_setup_error(error) is error
    assert isinstance(error.__cause__, KeyError)
    note = "\n".join(error.__notes__)
    assert "raised in the training stage's own process" in note
    assert "_fail_with_setup_error" in note  # the child's traceback


def test_an_error_that_cannot_travel_is_reported_with_its_message_and_traceback():
    with pytest.raises(StageProcessError) as raised:
        run_in_own_process("evaluation", _fail_with_an_unpicklable_error)
    message = str(raised.value)
    assert "the evaluation stage failed: _Unbuildable: holds a lock" in message
    assert "_fail_with_an_unpicklable_error" in message


def test_a_result_that_cannot_travel_is_reported_as_such():
    with pytest.raises(TypeError, match="cannot pickle") as raised:
        run_in_own_process("training", _return_a_lock)
    assert "raised in the training stage's own process" in "\n".join(raised.value.__notes__)


def test_a_stage_process_that_does_not_exit_after_its_result_is_stopped(monkeypatch, caplog):
    from conductor_pipeline import stage_process

    monkeypatch.setattr(stage_process, "_EXIT_GRACE_S", 1.0)
    child = run_in_own_process("training", _return_but_never_exit)
    assert child != os.getpid()
    assert multiprocessing.active_children() == []  # stopped, not left holding memory
    assert "had not exited 1 s after handing back its result" in caplog.text


def test_a_stage_process_that_dies_says_so_and_that_its_files_are_kept():
    with pytest.raises(StageProcessError) as raised:
        run_in_own_process("training", _die)
    message = str(raised.value)
    assert "training stage's process" in message and "SIGKILL" in message
    assert "run the same command again to resume" in message
    assert multiprocessing.active_children() == []


def test_the_profiles_choose_where_training_runs():
    from conductor_pipeline.pipelines.training import create_pipeline
    from conductor_pipeline.project import load_project_config

    gpu = load_project_config("gpu", root=REPO).parameters["stages"]["training"]
    base = load_project_config("base", root=REPO).parameters["stages"]["training"]
    assert gpu["own_process"] is True and base["own_process"] is False
    node = next(n for n in create_pipeline().nodes if n.name == "train_conductor")
    assert "params:stages.training.own_process" in node.inputs


# -- the real training node ---------------------------------------------------------------


def _training_inputs(tmp_path: Path, tiny_model_dir: Path, name: str) -> dict:
    """Everything the training node takes, for a one-step run on the tiny model against the
    sandbox's simulated workers (no real model, no cache)."""
    from tests.evaluation.conftest import sandbox_pool_config, write_tasks
    from tests.evaluation.fakes import make_tasks

    tasks = make_tasks(4, "train")
    path = write_tasks(tmp_path / "train_tasks.parquet", tasks)
    return {
        "tasks": [t.to_record() for t in tasks],
        "params": {
            "base_model": str(tiny_model_dir),
            "output_dir": str(tmp_path / name),
            "grpo": {
                "num_generations": 2,
                "prompts_per_step": 2,
                "max_steps": 1,
                "max_completion_length": 8,
            },
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "sft": {"enabled": True, "n_examples": 4, "max_steps": 1, "batch_size": 2},
        },
        "pool": sandbox_pool_config([path], cache_mode="off"),
        "tracking_uri": f"sqlite:///{tmp_path / name}-mlflow.db",
    }


def _run_training_node(inputs: dict, own_process: bool) -> dict:
    """The training node inside an MLflow run, as kedro-mlflow runs it; what it returned,
    the metrics its run received and where its log line came from."""
    import mlflow
    import pandas as pd

    from conductor_pipeline.pipelines.training.nodes import train_conductor_node

    lines: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("trained "):
                lines.append(record)

    trained = logging.getLogger("conductor_pipeline.pipelines.training.nodes")
    trained.setLevel(logging.INFO)
    trained.addHandler(keep := Keep())
    mlflow.set_tracking_uri(inputs["tracking_uri"])
    mlflow.set_experiment("stage-processes")
    try:
        with mlflow.start_run() as run:
            info, history, sft_history = train_conductor_node(
                pd.DataFrame(inputs["tasks"]),
                inputs["params"],
                {"few_shot": []},
                inputs["pool"],
                {},
                own_process=own_process,
            )
    finally:
        trained.removeHandler(keep)
    metrics = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    return {
        "info": json.loads(json.dumps(info, default=str)),
        "history_columns": sorted(history.columns),
        "history_steps": list(history["step"]),
        "sft_columns": list(sft_history.columns),
        "sft_steps": list(sft_history["step"]),
        "metrics": sorted(metrics),
        "log_pids": [r.process for r in lines],
        "pid": os.getpid(),
        "children_left": len(multiprocessing.active_children()),
        "trl_imported": "trl" in sys.modules,
    }


def _driver(inputs_path: str, output_path: str) -> None:
    """Entry point of the fresh interpreter: the node in its own process."""
    inputs = json.loads(Path(inputs_path).read_text())
    Path(output_path).write_text(json.dumps(_run_training_node(inputs, own_process=True)))


@pytest.mark.slow
def test_training_in_its_own_process_returns_what_it_returns_in_process(tiny_model_dir, tmp_path):
    own = _training_inputs(tmp_path, tiny_model_dir, "own")
    (tmp_path / "own.json").write_text(json.dumps(own))
    # a fresh interpreter as the `kedro run` process: whatever it imported, it imported itself
    driver = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tests.test_stage_processes import _driver; _driver(*sys.argv[1:])",
            str(tmp_path / "own.json"),
            str(tmp_path / "own-result.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert driver.returncode == 0, driver.stderr[-5000:]
    separate = json.loads((tmp_path / "own-result.json").read_text())

    together = _run_training_node(_training_inputs(tmp_path, tiny_model_dir, "same"), False)

    # the stage after training starts in a process that never built a trainer or a model:
    # training ran in a child (its log line carries the child's pid) that has exited
    assert separate["log_pids"] and separate["pid"] not in separate["log_pids"]
    assert separate["children_left"] == 0 and not separate["trl_imported"]
    assert together["log_pids"] == [together["pid"]]
    # the same outputs and the same MLflow metrics either way
    for key in ("history_columns", "history_steps", "sft_columns", "sft_steps"):
        assert separate[key] == together[key], key
    # the child logs into the parent's run (which metrics a step has depends on its samples)
    logged = {"grpo/reward/mean", "grpo/rollouts/parse_rate", "sft/loss", "training/prompts"}
    assert logged <= set(separate["metrics"]) and logged <= set(together["metrics"])
    same_identity = ("config_fingerprint", "data_version", "pool_fingerprint", "global_step")
    for key in same_identity:
        assert separate["info"][key] == together["info"][key], key
    assert set(separate["info"]) == set(together["info"])
    assert Path(separate["info"]["adapter_dir"]).is_relative_to(tmp_path / "own")
    assert (Path(separate["info"]["adapter_dir"]) / "adapter_config.json").is_file()
