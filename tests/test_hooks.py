"""Several processes train; evaluation, promotion and reporting are refused before the run
starts, with the commands that run them."""

from __future__ import annotations

import pytest

from conductor_pipeline.hooks import ProjectHooks, refuse_single_process_stages
from conductor_pipeline.pipeline_registry import register_pipelines

PIPELINES = register_pipelines()


def test_the_default_pipeline_is_refused_on_several_processes():
    with pytest.raises(RuntimeError) as err:
        refuse_single_process_stages(PIPELINES["__default__"], 4)
    message = str(err.value)
    assert "launched as 4 processes" in message
    assert "evaluation, promotion, reporting must run in one" in message
    assert "--pipelines training" in message


@pytest.mark.parametrize("name", ["training", "data_prep"])
def test_training_may_run_on_several_processes(name):
    refuse_single_process_stages(PIPELINES[name], 4)


def test_one_process_runs_everything():
    refuse_single_process_stages(PIPELINES["__default__"], 1)


def test_the_hook_refuses_before_the_first_node(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="evaluation must run in one"):
        ProjectHooks().before_pipeline_run({}, PIPELINES["evaluation"], catalog=None)
