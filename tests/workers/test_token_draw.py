"""draw_token: the token torch.multinomial draws, and the generator state it leaves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conductor_pipeline.workers.token_draw import draw_token, row_generator


def _torch_draw(scores: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    probs = torch.softmax(scores.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator)[0])


def _logits(kind: str, vocabulary: int, rng: np.random.Generator) -> torch.Tensor:
    if kind == "flat":  # hundreds of plausible tokens
        values = rng.normal(0.0, 0.5, vocabulary)
    elif kind == "peaked":  # one token nearly certain, as in most Conductor positions
        values = rng.normal(0.0, 1.0, vocabulary)
        values[rng.integers(vocabulary)] += 25.0
    elif kind == "two-way":  # a close call between two tokens
        values = np.full(vocabulary, -30.0)
        values[rng.choice(vocabulary, 2, replace=False)] = [3.0, 3.0 + rng.normal(0, 0.1)]
    else:  # "underflow": most probabilities are exactly zero in float32
        values = rng.normal(0.0, 1.0, vocabulary) * 60.0
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("seed", [0, 7, 2**31 + 5, 2**40 + 123_456_789])
@pytest.mark.parametrize("kind", ["flat", "peaked", "two-way", "underflow"])
def test_the_same_tokens_as_torch_multinomial_from_the_same_seed(seed, kind):
    rng = np.random.default_rng(seed % 1000)
    ours, theirs = row_generator(seed), torch.Generator().manual_seed(seed)
    for step in range(60):  # one stream: every draw must leave the state torch's leaves
        scores = _logits(kind, 2000 if step % 2 else 49_152, rng)
        temperature = (0.7, 1.0, 1.3)[step % 3]
        assert draw_token(scores, temperature, ours) == _torch_draw(scores, temperature, theirs)


def test_a_tie_goes_to_the_first_index_and_zero_temperature_is_greedy():
    scores = torch.zeros(5)  # five equal probabilities: whichever noise is smallest wins
    for seed in range(40):
        assert draw_token(scores, 1.0, row_generator(seed)) == _torch_draw(
            scores, 1.0, torch.Generator().manual_seed(seed)
        )
    generator = row_generator(3)
    before = generator.bit_generator.state["state"]["pos"]
    assert draw_token(torch.tensor([0.1, 2.0, 2.0, -1.0]), 0.0, generator) == 1
    assert generator.bit_generator.state["state"]["pos"] == before  # greedy draws no noise


def test_a_zero_uniform_is_handled_as_torch_divides_by_zero(monkeypatch):
    """Odds 2^-53 an entry: force one to check the exact path agrees with torch's rule (a
    zero noise makes its ratio infinite, so that entry wins)."""
    generator = row_generator(1)
    raw = generator.integers(0, 2**32, size=8, dtype=np.uint32)
    raw[4:6] = 0  # the third entry's uniform is zero

    class Replay:
        def integers(self, low, high, size, dtype):  # noqa: ANN001, ANN202
            assert (low, high, size, dtype) == (0, 2**32, 8, np.uint32)
            return raw.copy()

    scores = torch.tensor([5.0, 4.0, 0.0, 1.0])
    assert draw_token(scores, 1.0, Replay()) == 2
