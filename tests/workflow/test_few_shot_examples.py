"""The built-in worked examples (``few_shot: default``, the GPU profile's prompt): four
examples outside the benchmarks, parseable in the binary access format the GPU profile
uses, spread over the worker ids, in the three workflow shapes, and valid for both pools."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conductor_pipeline.workflow.config import prompt_config
from conductor_pipeline.workflow.parser import parse_workflow, render_workflow
from conductor_pipeline.workflow.prompts import DEFAULT_FEW_SHOT, conductor_messages

CONF = Path(__file__).resolve().parents[2] / "conf"


def _pool_size(env: str) -> int:
    pool = yaml.safe_load((CONF / env / "workers.yml").read_text())["worker_pool"]
    listed = pool.get("workers") or pool["sandbox"]["workers"]
    return len(listed)


def _gpu_prompt_section() -> dict:
    base = yaml.safe_load((CONF / "base" / "parameters_conductor.yml").read_text())
    gpu = yaml.safe_load((CONF / "gpu" / "parameters_conductor.yml").read_text())
    return {**base["conductor"]["prompt"], **gpu["conductor"]["prompt"]}


def _shape(workflow) -> str:
    steps = workflow.steps
    if len(steps) == 1:
        return "single"
    first_blind = all(not s.access for s in steps[:-1])
    if steps[-1].all_access and first_blind and len(steps) > 2:
        return "parallel_aggregate"
    if len(steps) == 2 and steps[1].all_access and not steps[0].access:
        return "solve_check"
    return "other"


def test_four_examples_in_every_shape_over_at_least_three_workers() -> None:
    assert len(DEFAULT_FEW_SHOT) == 4
    workflows = [ex.resolved(5) for ex in DEFAULT_FEW_SHOT]
    assert {_shape(wf) for wf in workflows} == {"single", "solve_check", "parallel_aggregate"}
    ids = {step.worker for wf in workflows for step in wf.steps}
    assert len(ids) >= 3 and ids != {0, 1}


def test_every_example_parses_in_the_binary_access_format() -> None:
    for ex in DEFAULT_FEW_SHOT:
        text = render_workflow(ex.workflow)
        parsed = parse_workflow(text, 7, positional_access=False)
        assert parsed == ex.workflow
        # with its reasoning in front, as the prompt shows a reply
        assert parse_workflow(f"{ex.reasoning}\n{text}", 7, positional_access=False) == parsed


@pytest.mark.parametrize("env", ["gpu", "base"])
def test_the_examples_name_only_workers_of_the_pool(env: str) -> None:
    n = _pool_size(env)
    assert n == {"gpu": 7, "base": 6}[env]
    config = prompt_config({"few_shot": "default", "positional_access": False})
    user = conductor_messages("What is 2 + 2?", [""] * n, config)[1]["content"]
    shown = [
        int(i) for ids in re.findall(r"model_id = \[([\d, ]+)\]", user) for i in ids.split(",")
    ]
    assert len(shown) == sum(len(ex.resolved(5).steps) for ex in DEFAULT_FEW_SHOT)
    assert max(shown) < n and len(set(shown)) >= 3


def test_the_gpu_profile_prompts_with_the_built_in_examples() -> None:
    section = _gpu_prompt_section()
    assert section["few_shot"] == "default"
    config = prompt_config(section)  # refuses examples its access format cannot express
    assert [ex.question for ex in config.few_shot] == [ex.question for ex in DEFAULT_FEW_SHOT]
