"""The shared configuration checks: one message for unknown keys, one integer check."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conductor_pipeline.config_checks import check_int, check_keys, is_int, unknown_keys_message


class SectionError(ValueError):
    pass


def test_an_unknown_key_is_named_with_the_closest_known_key_and_every_known_key():
    with pytest.raises(ValueError) as err:
        check_keys("evaluation", {"test_per_domian": 3, "seed": 0}, ["seed", "test_per_domain"])
    assert str(err.value) == (
        "evaluation: unknown key 'test_per_domian' (did you mean 'test_per_domain'?); "
        "known keys: seed, test_per_domain"
    )


def test_several_unknown_keys_are_all_named_each_with_its_own_suggestion():
    message = unknown_keys_message("serving", ["zzz", "hots"], ["host", "port"])
    assert (
        message
        == "serving: unknown keys 'hots' (did you mean 'host'?), 'zzz'; known keys: host, port"
    )


def test_a_key_with_nothing_close_gets_no_suggestion():
    assert unknown_keys_message("worker_pool", ["xyz"], ["kind", "cache"]) == (
        "worker_pool: unknown key 'xyz'; known keys: cache, kind"
    )


def test_a_non_string_key_from_yaml_is_named_as_written():
    with pytest.raises(ValueError, match=r"retraining: unknown key 1; known keys: lock"):
        check_keys("retraining", {1: "x"}, {"lock"})


def test_known_keys_pass_and_the_section_error_type_is_kept():
    check_keys("training", {"seed": 1}, {"seed", "lora"})
    check_keys("training", {}, set())
    with pytest.raises(SectionError, match="training.lora: unknown key 'rank'"):
        check_keys("training.lora", {"rank": 8}, {"r"}, error=SectionError)


@pytest.mark.parametrize("value", [0, 3, 10**12])
def test_an_integer_at_or_above_the_minimum_is_returned(value):
    assert check_int(value, "evaluation.seed") == value
    assert is_int(value)


@pytest.mark.parametrize(
    "value, minimum, expected",
    [
        (True, 0, "evaluation.seed: must be an integer >= 0, got True"),
        (1.0, 0, "evaluation.seed: must be an integer >= 0, got 1.0"),
        ("3", 0, "evaluation.seed: must be an integer >= 0, got '3'"),
        (-1, 0, "evaluation.seed: must be an integer >= 0, got -1"),
        (0, 1, "evaluation.seed: must be a positive integer, got 0"),
        (None, 1, "evaluation.seed: must be a positive integer, got None"),
        (512, 1024, "evaluation.seed: must be an integer >= 1024, got 512"),
        (2.5, None, "evaluation.seed: must be an integer, got 2.5"),
    ],
)
def test_anything_else_is_refused_naming_the_key(value, minimum, expected):
    with pytest.raises(ValueError) as err:
        check_int(value, "evaluation.seed", minimum=minimum)
    assert str(err.value) == expected
    assert not is_int(value, minimum=minimum)


def test_without_a_minimum_any_integer_passes():
    assert check_int(-7, "worker_pool.faults.seed", minimum=None) == -7
    assert is_int(-7, minimum=None) and not is_int(False, minimum=None)


def test_none_passes_only_where_allowed_and_the_message_says_so():
    assert check_int(None, "evaluation.test_per_domain", minimum=1, allow_none=True) is None
    with pytest.raises(SectionError) as err:
        check_int(
            "abc", "evaluation.test_per_domain", minimum=1, allow_none=True, error=SectionError
        )
    assert str(err.value) == (
        "evaluation.test_per_domain: must be a positive integer or null, got 'abc'"
    )


def test_the_module_imports_neither_kedro_nor_mlflow():
    code = (
        "import sys, conductor_pipeline.config_checks; "
        "print(sorted(m for m in ('kedro', 'mlflow') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _validators():
    from conductor_pipeline.evaluation.config import EvaluationConfig
    from conductor_pipeline.pipelines.data_prep.nodes import validate_params
    from conductor_pipeline.preflight import PreflightSettings
    from conductor_pipeline.promotion import Gates
    from conductor_pipeline.serving.settings import serving_settings
    from conductor_pipeline.tasks.sources.growing import sources_settings
    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.workers.runtime import fault_settings
    from conductor_pipeline.workflow.config import orchestration_config

    return [
        (EvaluationConfig.from_params, {"sed": 1}, "evaluation: unknown key 'sed'"),
        (TrainingConfig.from_params, {"lora": {"rank": 8}}, "training.lora: unknown key 'rank'"),
        (Gates.from_params, {"min_parse": 0.5}, "promotion.gates: unknown key 'min_parse'"),
        (validate_params, {"sead": 3}, "data_prep: unknown key 'sead'"),
        (PreflightSettings.from_params, {"enable": True}, "preflight: unknown key 'enable'"),
        (serving_settings, {"batching": {"size": 2}}, "serving.batching: unknown key 'size'"),
        (serving_settings, {"capture": {"feedback": {"keep": 1}}}, "serving.capture.feedback"),
        (sources_settings, {"traffic": {"enable": True}}, "retraining_sources.traffic: unknown"),
        (fault_settings, {"faults": {"rate": {}}}, "worker_pool.faults: unknown key 'rate'"),
        (
            orchestration_config,
            {"sampling": {"temprature": 0.5}},
            "conductor.sampling: unknown key 'temprature' (did you mean 'temperature'?)",
        ),
    ]


def test_every_section_names_an_unknown_key_in_the_one_format():
    for validate, params, start in _validators():
        with pytest.raises(ValueError) as err:
            validate(params)
        assert str(err.value).startswith(start), str(err.value)
        assert "; known keys: " in str(err.value)


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"batching": {"max_batch": 0}}, "serving.batching.max_batch: must be a positive integer"),
        ({"torch_threads": True}, "serving.torch_threads: must be a positive integer or null"),
        ({"capture": {"keep_files": -1}}, "serving.capture.keep_files: must be an integer >= 0"),
    ],
)
def test_integer_settings_use_the_one_integer_check(params, expected):
    from conductor_pipeline.serving.settings import serving_settings

    with pytest.raises(ValueError, match=re.escape(expected)):
        serving_settings(params)
