"""Training and evaluation price a worker the same way (``workers/pricing.py``)."""

from __future__ import annotations

import pytest

from conductor_pipeline.evaluation.systems import PoolView
from conductor_pipeline.training.inputs import PoolInfo
from conductor_pipeline.workers import WorkerPool, load_worker_specs
from conductor_pipeline.workers.pricing import pool_token_prices, token_prices

# LiteLLM's bundled price map (tests/conftest.py sets LITELLM_LOCAL_MODEL_COST_MAP=True)
MAPPED_MODEL = "openai/gpt-4o-mini"


@pytest.fixture
def pool():
    specs = load_worker_specs(
        {
            "workers": [
                {
                    "name": "configured",
                    "model": "openai/sim-configured",
                    "api_base": "http://127.0.0.1:1/v1",
                    "input_cost_per_token": 1.0e-7,
                    "output_cost_per_token": 3.0e-7,
                },
                {"name": "mapped", "model": MAPPED_MODEL, "api_base": "http://127.0.0.1:1/v1"},
                {
                    "name": "unknown",
                    "model": "openai/sim-unpriced",
                    "api_base": "http://127.0.0.1:1/v1",
                },
            ]
        },
        environ={},
    )
    return WorkerPool(specs)


def test_training_and_evaluation_price_the_same_workers_alike(pool):
    import litellm

    info = litellm.get_model_info(MAPPED_MODEL)
    mapped = (float(info["input_cost_per_token"]), float(info["output_cost_per_token"]))
    assert mapped[0] > 0 and mapped[1] > 0

    training = PoolInfo.from_pool(pool).prices
    evaluation = PoolView.from_pool(pool).prices
    assert training == evaluation == [(1.0e-7, 3.0e-7), mapped, None]


def test_configured_prices_win_over_litellms_map(pool):
    configured = load_worker_specs(
        [
            {
                "name": "priced",
                "model": MAPPED_MODEL,
                "input_cost_per_token": 2.0e-6,
                "output_cost_per_token": 5.0e-6,
            }
        ],
        environ={},
    )[0]
    assert token_prices(configured) == (2.0e-6, 5.0e-6)


def test_a_pool_without_specs_has_no_prices():
    class Bare:
        names = ["a"]
        descriptions = ["d"]

    assert pool_token_prices(Bare()) == []
    assert PoolInfo.from_pool(Bare()).prices == []
    assert PoolView.from_pool(Bare()).prices == [None]
