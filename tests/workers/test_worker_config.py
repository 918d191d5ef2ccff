"""Validation of worker specs (workers.yml entries)."""

from __future__ import annotations

import pytest

from conductor_pipeline.workers import WorkerConfigError, WorkerSpec, load_worker_specs


def _entry(**extra):
    return {"name": "w1", "model": "openai/sim-a", "api_base": "http://127.0.0.1:1/v1", **extra}


def test_full_entry_parses():
    config = {
        "defaults": {"timeout_s": 30, "num_retries": 1},
        "workers": [
            _entry(
                description="  first  ",
                temperature=0.2,
                max_tokens=64,
                top_p=0.9,
                extra_params={"seed": 1},
                input_cost_per_token=1e-6,
                output_cost_per_token=2e-6,
                max_concurrency=3,
                fallbacks=["w2"],
            ),
            {"name": "w2", "model": "anthropic/claude-3-5-haiku-20241022", "timeout_s": 10},
        ],
    }
    first, second = load_worker_specs(config)
    assert isinstance(first, WorkerSpec)
    assert first.description == "first"
    assert first.sampling_params == {"temperature": 0.2, "max_tokens": 64, "top_p": 0.9, "seed": 1}
    assert first.has_prices and first.fallbacks == ("w2",)
    assert first.timeout_s == 30 and first.num_retries == 1 and first.max_concurrency == 3
    assert second.timeout_s == 10 and not second.has_prices and second.api_key is None
    # a bare list of entries is accepted too
    assert [s.name for s in load_worker_specs([_entry()])] == ["w1"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"workers": [_entry(colour="red")]}, "unknown key 'colour'"),
        ({"workers": [{"name": "w1"}]}, "missing 'model'"),
        ({"workers": [{"model": "openai/x"}]}, "missing 'name'"),
        ({"workers": [_entry(), _entry()]}, "duplicate worker name 'w1'"),
        ({"workers": [_entry(fallbacks=["ghost"])]}, "unknown worker 'ghost'"),
        ({"workers": [_entry(fallbacks=["w1"])]}, "must not name the worker itself"),
        (
            {"workers": [_entry(input_cost_per_token=-1e-6, output_cost_per_token=1e-6)]},
            "'input_cost_per_token' must be >= 0",
        ),
        ({"workers": [_entry(input_cost_per_token=1e-6)]}, "give both"),
        ({"workers": [_entry(api_key="sk-oops")]}, "key 'api_key' is not allowed"),
        ({"workers": [_entry(timeout_s=0)]}, "'timeout_s' must be > 0"),
        ({"workers": [_entry(max_concurrency=0)]}, "'max_concurrency' must be >= 1"),
        ({"workers": [_entry(num_retries=-1)]}, "'num_retries' must be >= 0"),
        ({"workers": [_entry(temperature="hot")]}, "'temperature' must be a number"),
        ({"workers": [_entry(top_p=1.5)]}, "'top_p' must be <= 1"),
        ({"workers": [_entry(extra_params={"api_key": "x"})]}, "'extra_params'"),
        ({"workers": []}, "non-empty list"),
        ({"workers": [_entry()], "pool": {}}, "unknown top-level key 'pool'"),
        ({"workers": [_entry(api_key_env="A", credentials_key="b")]}, "not both"),
    ],
)
def test_bad_config_names_the_key(config, message):
    with pytest.raises(WorkerConfigError, match=None) as info:
        load_worker_specs(config, credentials={"b": "x"}, environ={"A": "y"})
    assert message in str(info.value)


def test_keys_come_from_credentials_or_environment_only():
    secret = "sk-test-Zq81-credentials"
    specs = load_worker_specs(
        {
            "workers": [
                _entry(name="a", credentials_key="fake"),
                _entry(name="b", api_key_env="MY_KEY"),
                _entry(name="c", credentials_key="plain"),
            ]
        },
        credentials={"fake": {"api_key": secret}, "plain": "sk-plain-value"},
        environ={"MY_KEY": "sk-from-env-value"},
    )
    assert specs[0].api_key.get() == secret
    assert specs[1].api_key.get() == "sk-from-env-value"
    assert specs[2].api_key.get() == "sk-plain-value"
    for spec in specs:
        assert spec.api_key.get() not in repr(spec)
        assert spec.api_key.get() not in str(spec)
    with pytest.raises(WorkerConfigError, match="'MISSING_VAR'"):
        load_worker_specs({"workers": [_entry(api_key_env="MISSING_VAR")]}, environ={})
    with pytest.raises(WorkerConfigError, match="'nope' is not in the credentials"):
        load_worker_specs({"workers": [_entry(credentials_key="nope")]}, credentials={})
