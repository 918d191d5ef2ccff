"""The shared configuration checks: one message for unknown keys, one integer check."""

from __future__ import annotations

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
    ],
)
def test_anything_else_is_refused_naming_the_key(value, minimum, expected):
    with pytest.raises(ValueError) as err:
        check_int(value, "evaluation.seed", minimum=minimum)
    assert str(err.value) == expected
    assert not is_int(value, minimum=minimum)


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
