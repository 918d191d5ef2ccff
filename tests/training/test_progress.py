"""The training progress bars: one per stage, step/total, ETA and the stage's key numbers,
in place of the trainers' printed log dicts."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from conductor_pipeline.training.progress import StageProgress, grpo_postfix, sft_postfix


def _state(step: int, max_steps: int = 3) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=max_steps, is_world_process_zero=True)


def test_the_bar_counts_steps_and_shows_the_key_metric():
    out = io.StringIO()
    bar = StageProgress("SFT", sft_postfix, file=out, enabled=True)
    bar.on_train_begin(None, _state(0), None)
    for step, loss in ((1, 2.5), (2, 1.25), (3, 0.5)):
        bar.on_step_end(None, _state(step), None)
        bar.on_log(None, _state(step), None, logs={"loss": loss, "epoch": 0.07})
    bar.on_log(None, _state(3), None, logs={"train_runtime": 1.0, "train_loss": 1.4})
    bar.on_train_end(None, _state(3), None)
    text = out.getvalue()
    assert "SFT" in text and "3/3" in text and "loss=0.5" in text
    assert "epoch" not in text and "train_runtime" not in text
    assert "<" in text  # tqdm's elapsed<remaining (the ETA)


def test_a_resumed_stage_starts_at_its_step_and_other_processes_draw_nothing():
    out = io.StringIO()
    bar = StageProgress("GRPO", sft_postfix, file=out, enabled=True)
    bar.on_train_begin(None, _state(2, 4), None)
    assert bar.bar.n == 2
    bar.on_train_end(None, _state(2, 4), None)
    silent = io.StringIO()
    other = StageProgress("GRPO", sft_postfix, file=silent, enabled=False)
    other.on_train_begin(None, _state(0), None)
    other.on_step_end(None, _state(1), None)
    other.on_log(None, _state(1), None, logs={"loss": 1.0})
    other.on_train_end(None, _state(1), None)
    assert silent.getvalue() == ""


def test_grpo_postfix_reads_the_step_record_of_its_stage():
    history: list[dict[str, float]] = []
    postfix = grpo_postfix(history)
    assert postfix({"loss": 0.1}) == {}
    history.append({"step": 1.0, "grpo/reward/mean": 0.5, "grpo/rollouts/parse_rate": 0.75})
    assert postfix({"loss": 0.1}) == {"reward": 0.5, "parse": 0.75}


@pytest.mark.slow
def test_training_shows_one_bar_per_stage_and_prints_no_log_dicts(tiny_model_dir, tmp_path, capsys):
    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.training.grpo import train_conductor
    from conductor_pipeline.training.inputs import PoolInfo

    from .fakes import FakePool, make_task

    tasks = [make_task(i) for i in range(4)]
    pool = FakePool(tasks)
    config = TrainingConfig.from_params(
        {
            "base_model": str(tiny_model_dir),
            "output_dir": str(tmp_path / "out"),
            "grpo": {
                "num_generations": 2,
                "prompts_per_step": 2,
                "max_steps": 1,
                "max_completion_length": 8,
            },
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "sft": {"enabled": True, "n_examples": 4, "max_steps": 2, "batch_size": 2},
            "reward": {"retry_delay_s": 0.0, "infra_retries": 1},
        }
    )
    logged: list[tuple[dict, int]] = []
    result = train_conductor(
        tasks,
        PoolInfo(pool, pool.names, pool.descriptions, pool.prices),
        config,
        prompt={"few_shot": []},
        log_metrics=lambda metrics, step: logged.append((metrics, step)),
    )
    captured = capsys.readouterr()
    assert "{'loss'" not in captured.out and "'epoch'" not in captured.out
    assert "SFT" in captured.err and "2/2" in captured.err and "loss=" in captured.err
    assert "GRPO" in captured.err and "1/1" in captured.err
    assert "reward=" in captured.err and "parse=" in captured.err
    # the SFT loss per step: in MLflow (sft/loss at steps 1, 2) and in the result
    assert [step for metrics, step in logged if "sft/loss" in metrics] == [1, 2]
    assert [r["step"] for r in result.sft_history] == [1.0, 2.0]
    assert all(r["loss"] > 0 for r in result.sft_history)
