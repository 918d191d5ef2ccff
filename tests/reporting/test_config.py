"""The reporting, promotion and retraining parameters of both profiles validate."""

from __future__ import annotations

import pytest

from conductor_pipeline.pipelines.promotion.nodes import promotion_settings
from conductor_pipeline.pipelines.reporting.nodes import reporting_settings
from conductor_pipeline.pipelines.retraining.nodes import retraining_settings
from conductor_pipeline.project import load_project_config
from tests.reporting.conftest import REPO


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_profiles_validate(env, monkeypatch):
    for variable in ("GEMINI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "VLLM_API_KEY"):
        monkeypatch.setenv(variable, "dummy")
    parameters = load_project_config(env, root=REPO).parameters
    gates, champion_system, _ = promotion_settings(parameters["promotion"])
    assert 0 < gates.min_parse_rate <= 1 and champion_system
    assert reporting_settings(parameters["reporting"])["kernel_name"] == "python3"
    assert retraining_settings(parameters["retraining"])["lock"]["path"]


def test_unknown_keys_are_named():
    with pytest.raises(
        ValueError,
        match=r"promotion\.gates: unknown key 'min_parse' \(did you mean 'min_parse_rate'\?\)",
    ):
        promotion_settings({"gates": {"min_parse": 0.5}})
    with pytest.raises(
        ValueError,
        match=r"reporting: unknown key 'kernel' \(did you mean 'kernel_name'\?\); known keys: kernel_name,",
    ):
        reporting_settings({"kernel": "python3"})
