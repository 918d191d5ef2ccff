"""`accelerate launch --num_processes 2 -m kedro run --pipelines training` on the CPU (gloo):
both processes train, but only the main one saves the adapter, writes the catalog's files,
opens the MLflow run and registers the model, so the run ends with one registered version
and one MLflow run (not one per process, and no FileExistsError from two processes clearing
and creating the same adapter folder)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys

import pytest

from tests.training.project_copy import write_training_project


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_process_launch_saves_registers_and_logs_once(tmp_path, tiny_model_dir):
    root = tmp_path / "project"
    # simulated workers only; one step of 4 rollouts: 2 per process, no gradient accumulation
    write_training_project(
        root,
        tiny_model_dir,
        workers=["sim-sage", "sim-abacus", "sim-coder"],
        per_domain=2,
        grpo={
            "num_generations": 4,
            "prompts_per_step": 1,
            "micro_batch_size": 2,
            "max_completion_length": 8,
        },
        sft={"batch_size": 1},
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CONDUCTOR_PROJECT_ROOT", "MLFLOW_TRACKING_URI", "RANK", "WORLD_SIZE")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # `--multi_gpu` picks torchrun's multi-process launcher; without a GPU the trainer's
    # `use_cpu` makes accelerate join the processes over gloo on the CPU
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        "-m",
        "kedro",
        "run",
        "--pipelines",
        "training",
    ]
    done = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    assert done.returncode == 0, "\n".join(errors[-20:]) or done.stderr[-4000:]

    with sqlite3.connect(root / "mlruns" / "mlflow.db") as conn:
        versions = conn.execute("SELECT name, version FROM model_versions").fetchall()
        runs = conn.execute("SELECT run_uuid FROM runs").fetchall()
        registered_in = conn.execute("SELECT DISTINCT run_id FROM model_versions").fetchall()
    assert versions == [("conductor", 1)]
    assert len(runs) == 1, runs
    assert registered_in == [runs[0]]

    registered = json.loads((root / "data/06_models/conductor/registered_model.json").read_text())
    assert registered["version"] == "1"
    info = json.loads((root / "data/06_models/conductor/adapter_info.json").read_text())
    adapter = root / info["adapter_dir"]
    assert (adapter / "adapter_config.json").is_file()
    assert not (adapter / "training_args.bin").exists()
    assert (adapter / "warm_start" / "adapter_config.json").is_file()
