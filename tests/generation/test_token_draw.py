"""The engine's one token draw: transformers' sampling distribution, one seeded generator per
row, a row's draws independent of the rows beside it."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from conductor_pipeline.generation import token_draw
from conductor_pipeline.generation.token_draw import (
    draw_token,
    draw_tokens,
    row_generator,
    top_p_scores,
)

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
DRAWS = 60_000


def _frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=len(LOGITS)).double() / len(tokens)


def test_draws_follow_the_softmax_of_the_tempered_logits():
    temperature = 0.7
    # one generator drawn from DRAWS times in order, as one row is over DRAWS positions
    generator = row_generator(0)
    tokens = draw_tokens(LOGITS.expand(DRAWS, -1), temperature, [generator] * DRAWS)
    expected = torch.softmax(LOGITS / temperature, dim=-1).double()
    torch.testing.assert_close(_frequencies(tokens), expected, atol=0.01, rtol=0)


def test_top_p_keeps_the_nucleus_transformers_keeps():
    temperature, top_p = 0.7, 0.8
    tokens = draw_tokens(LOGITS.expand(DRAWS, -1), temperature, [row_generator(1)] * DRAWS, top_p)
    tempered = TemperatureLogitsWarper(temperature)(None, LOGITS[None].clone())
    scores = TopPLogitsWarper(top_p)(None, tempered)[0]
    expected = torch.softmax(scores, dim=-1).double()
    assert int(expected.gt(0).sum()) < len(LOGITS)  # the warper did cut the tail
    assert not bool(tokens[expected[tokens] == 0].numel())
    torch.testing.assert_close(_frequencies(tokens), expected, atol=0.01, rtol=0)


def test_a_seed_gives_the_same_draws_and_another_seed_other_ones():
    logits = torch.randn(49_152, generator=torch.Generator().manual_seed(4))

    def draws(seed: int) -> list[int]:
        generator = row_generator(seed)
        return [draw_token(logits, 1.0, generator) for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_a_rows_draws_do_not_depend_on_the_rows_beside_it():
    vocabulary, positions = 1_000, 12
    logits = torch.randn(positions, 5, vocabulary, generator=torch.Generator().manual_seed(5))
    alone_generator = row_generator(42)
    alone = [draw_tokens(logits[t, 2:3], 1.0, [alone_generator])[0] for t in range(positions)]
    batch = [row_generator(seed) for seed in (3, 9, 42, 11, 0)]
    together = [draw_tokens(logits[t], 1.0, batch)[2] for t in range(positions)]
    assert [int(t) for t in alone] == [int(t) for t in together]
    # and in a smaller batch, in another place
    pair = [row_generator(42), row_generator(5)]
    swapped = [draw_tokens(logits[t, [2, 0]], 1.0, pair)[0] for t in range(positions)]
    assert [int(t) for t in alone] == [int(t) for t in swapped]


def test_temperature_zero_takes_the_most_likely_token_without_drawing():
    generator = row_generator(3)
    state = generator.get_state()
    assert draw_token(torch.tensor([0.1, 2.0, 2.0, -1.0]), 0.0, generator) == 1
    assert torch.equal(generator.get_state(), state)


def test_a_zero_probability_token_is_never_drawn():
    logits = torch.tensor([0.0, float("-inf"), 0.0, float("-inf")])
    tokens = draw_tokens(logits.expand(2_000, -1), 1.0, [row_generator(0)] * 2_000)
    assert set(tokens.tolist()) == {0, 2}


@pytest.mark.parametrize("scale", [0.5, 2.0, 6.0, 12.0, 30.0])
def test_top_p_keeps_the_same_tokens_as_transformers_warper(scale):
    """Flat rows (a nucleus past the candidates, so the whole vocabulary is sorted) and
    peaked ones (the nucleus among the candidates) alike."""
    logits = torch.randn(40, 49_152, generator=torch.Generator().manual_seed(6)) * scale
    for row in logits:
        for top_p in (0.5, 0.9, 0.95):
            ours = top_p_scores(row[None], top_p)
            theirs = TopPLogitsWarper(top_p)(None, row[None].clone())
            assert torch.equal(ours.isinf(), theirs.isinf()), (scale, top_p)
            assert torch.equal(ours[~ours.isinf()], row[~ours.isinf()[0]])


def test_a_nucleus_past_the_candidates_is_found_by_sorting_everything(monkeypatch):
    monkeypatch.setattr(token_draw, "NUCLEUS_CANDIDATES", 4)
    flat = torch.zeros(1, 100)  # top-p 0.9 keeps 90 equally likely tokens
    assert int((~top_p_scores(flat, 0.9).isinf()).sum()) == 90
