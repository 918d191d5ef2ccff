"""Evaluation settings: both shipped profiles validate, and a bad key is named."""

from __future__ import annotations

import pytest

from conductor_pipeline.evaluation import EvaluationConfig
from conductor_pipeline.project import load_project_config

from .conftest import REPO


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_shipped_profiles_validate(env):
    config = EvaluationConfig.from_params(
        load_project_config(env, root=REPO).parameters["evaluation"]
    )
    assert config.wants("conductor") and config.wants("oracle")
    if env == "gpu":
        assert set(config.benchmarks) == {
            "math500",
            "mmlu",
            "rlpr",
            "livecodebench",
            "aime25",
            "bigcodebench",
            "gpqa_diamond",
        }
        assert config.conductor.max_parse_attempts == 5 and config.report_by == "source"
    else:
        assert config.test_per_domain != 0 and not config.benchmarks  # None: the whole split


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"sed": 1}, "evaluation: unknown key 'sed' \\(did you mean 'seed'\\?\\); known keys: "),
        ({"systems": ["conductor", "magic"]}, "evaluation.systems"),
        ({"systems": ["conductor+recursion"]}, "evaluation.systems"),
        ({"systems": ["router"]}, "evaluation.systems"),
        ({"moa": {"layers": 0}}, "evaluation.moa.layers"),
        ({"moa": {"proposer": ["a"]}}, "evaluation.moa: unknown key 'proposer'"),
        ({"best_of_n": {"n": 0}}, "evaluation.best_of_n.n"),
        ({"test_per_domain": "all"}, "evaluation.test_per_domain"),
        ({"metrics": {"confidence": 1.5}}, "evaluation.metrics.confidence"),
        ({"conductor": {"batch_size": 0}}, "evaluation.conductor.batch_size"),
        ({"benchmarks": {"math500": 3}}, "evaluation.benchmarks.math500"),
        ({"report_by": "worker"}, "evaluation.report_by"),
    ],
)
def test_bad_settings_name_the_key(params, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.").replace("+", r"\+")):
        EvaluationConfig.from_params(params)
