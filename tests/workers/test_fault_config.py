"""``worker_pool.faults``: checked, off by default in every profile, settable through Kedro's
runtime parameters, and reaching the pool that ``open_worker_pool`` yields."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conductor_pipeline.workers.faults import FaultInjector, ProviderFaults
from conductor_pipeline.workers.runtime import FaultSettings, fault_settings, open_worker_pool
from conductor_pipeline.workers.types import FailureKind

REPO = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "What is 2 plus 2?"}]


def configured(faults=None, num_retries: int = 2) -> dict:
    """A pool of one OpenAI-compatible worker at a port nothing listens on: every call that
    gets past the injected faults would fail to connect, so none must."""
    config = {
        "kind": "configured",
        "cache": {"mode": "off"},
        "workers": [
            {
                "name": "w",
                "model": "openai/w",
                "api_base": "http://127.0.0.1:9/v1",
                "description": "unreachable",
                "num_retries": num_retries,
                "timeout_s": 2,
            }
        ],
    }
    if faults is not None:
        config["faults"] = faults
    return config


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        (
            {"rate": {"timeout": 0.1}},
            r"worker_pool.faults: unknown key 'rate' \(did you mean 'rates'\?\)",
        ),
        ({"level": "router"}, r"worker_pool.faults.level"),
        ({"seed": "seven", "rates": {"timeout": 0.1}}, r"worker_pool.faults.seed"),
        ({"rates": {"slow": 0.1}}, r"worker_pool.faults.rates: unknown failure kind 'slow'"),
        ({"rates": {"timeout": 1.5}}, r"worker_pool.faults.rates: fault rate for 'timeout'"),
        ({"rates": {"timeout": 0.6, "rate_limit": 0.6}}, r"add up to more than 1"),
        ({"rates": {"malformed_reply": 0.1}}, r"use level: pool"),
        ([0.1], r"worker_pool.faults: must be a mapping"),
    ],
)
def test_bad_fault_settings_name_the_key(faults, message, tmp_path):
    with (
        pytest.raises(ValueError, match=message),
        open_worker_pool(configured(faults), root=tmp_path),
    ):
        pass


def test_zero_rates_and_no_section_are_off():
    assert fault_settings({}) == FaultSettings()
    zero = {"rates": {"timeout": 0.0, "rate_limit": 0}, "seed": 3}
    assert not fault_settings({"faults": zero}).active
    on = fault_settings({"faults": {"level": "pool", "rates": {"malformed_reply": 0.2}}})
    assert on == FaultSettings("pool", None, {"malformed_reply": 0.2})


@pytest.mark.parametrize("env", ["base", "gpu"])
def test_profiles_ship_faults_off_and_runtime_params_turn_them_on(env):
    from kedro.config import OmegaConfigLoader

    from conductor_pipeline.settings import CONFIG_LOADER_ARGS

    args = {**CONFIG_LOADER_ARGS, "default_run_env": env}

    def load(runtime_params=None):
        loader = OmegaConfigLoader(
            conf_source=str(REPO / "conf"), env=env, runtime_params=runtime_params, **args
        )
        return fault_settings(loader["workers"]["worker_pool"])

    assert not load().active
    # what `kedro run --params "worker_pool.faults.rates.timeout=0.3,..."` hands the loader
    params = {"worker_pool": {"faults": {"seed": 7, "rates": {"timeout": 0.3}}}}
    assert load(params) == FaultSettings("provider", 7, {"timeout": 0.3})
    params = {"worker_pool": {"faults": {"level": "pool", "rates": {"empty_reply": 0.1}}}}
    assert load(params) == FaultSettings("pool", None, {"empty_reply": 0.1})


def test_pool_level_faults_wrap_every_call(tmp_path):
    faults = {"level": "pool", "seed": 1, "rates": {"rate_limit": 1.0}}
    with open_worker_pool(configured(faults), root=tmp_path) as pool:
        assert isinstance(pool.faults, FaultInjector) and pool.faults.seed == 1
        reply = asyncio.run(pool(0, MESSAGES))
        stats = pool.faults.stats
    assert reply.failure is FailureKind.RATE_LIMIT and reply.attempts == 1
    assert stats == {"passed": 0, "injected": {"rate_limit": 1}}


def test_provider_level_faults_go_through_the_routers_retries(tmp_path):
    faults = {"seed": 2, "rates": {"timeout": 1.0}}
    with open_worker_pool(configured(faults, num_retries=2), root=tmp_path) as pool:
        assert isinstance(pool.faults, ProviderFaults) and pool.faults.seed == 2
        reply = asyncio.run(pool(0, MESSAGES))
        stats = pool.faults.stats
    # the Router tried three times (1 + num_retries), each attempt drew an injected timeout
    assert reply.failure is FailureKind.TIMEOUT and reply.attempts == 3
    assert stats["attempts"] == {"w": 3} and stats["injected"] == {"timeout": 3}


def test_a_null_seed_is_drawn_per_run_and_a_fixed_one_replays(tmp_path):
    """A resume must meet new faults unless the run asks to replay: ``seed: null`` draws one
    each time the pool opens; an integer gives the same failures call for call."""

    def outcomes(seed):
        faults = {"level": "pool", "seed": seed, "rates": {"timeout": 0.5}}
        with open_worker_pool(configured(faults, num_retries=0), root=tmp_path) as pool:
            used = pool.faults.seed

            async def many():
                return [await pool(0, MESSAGES, sample_index=i) for i in range(24)]

            # the calls let through fail too (nobody listens): tell the injected ones apart
            return used, [r.error == "injected timeout" for r in asyncio.run(many())]

    first, second = outcomes(None), outcomes(None)
    assert first[0] != second[0] and first[1] != second[1]
    assert outcomes(11) == outcomes(11)


def test_explicit_fault_arguments_replace_the_configured_ones(tmp_path):
    faults = {"level": "pool", "rates": {"rate_limit": 1.0}}
    with open_worker_pool(
        configured(faults), root=tmp_path, fault_rates={"empty_reply": 1.0}, fault_seed=4
    ) as pool:
        reply = asyncio.run(pool(0, MESSAGES))
        assert pool.faults.rates == {FailureKind.EMPTY_REPLY: 1.0} and pool.faults.seed == 4
    assert reply.failure is FailureKind.EMPTY_REPLY
