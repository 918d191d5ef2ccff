"""Packed batches (generation/attention.py) and in-place cache appends
(generation/kv_cache.py), without a model: the real-model equivalence is in
tests/generation/test_decode.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_packed_rows_unpack_to_the_padded_layout_and_pack_back():
    from conductor_pipeline.generation.attention import PackedRows

    lengths = [3, 1, 2]  # tokens fed to each row; the padded layout is 3 rows x 3 columns
    at = [(j, i) for j, n in enumerate(lengths) for i in range(n)]
    rows_at, columns_at = (torch.tensor(c) for c in zip(*at, strict=True))
    packed_rows = PackedRows(rows_at, columns_at, rows=3, width=3)
    packed = torch.arange(1, 1 + 2 * 6 * 4, dtype=torch.float32).view(1, 2, 6, 4)  # 2 heads

    padded = packed_rows.unpack(packed)
    assert padded.shape == (3, 2, 3, 4)
    for t, (j, i) in enumerate(at):
        assert torch.equal(padded[j, :, i], packed[0, :, t])
    assert padded[1, :, 1:].abs().sum() == 0 and padded[2, :, 2].abs().sum() == 0  # pads
    assert torch.equal(packed_rows.pack(padded.transpose(1, 2)), packed.transpose(1, 2))


def test_a_bfloat16_single_query_attends_without_sdpa_and_answers_as_sdpa_does():
    """On a CPU, SDPA runs one bfloat16 query a row several times slower than float32: such
    passes attend through two matrix products (grouped heads, a float32 softmax) and answer
    in bfloat16 what SDPA answers in float32, under a boolean or an additive mask; longer
    queries, and float32 ones, stay with SDPA."""
    from conductor_pipeline.generation.attention import grouped_sdpa

    module = torch.nn.Module()
    gen = torch.Generator().manual_seed(0)
    rows, width = 4, 40
    seen: list[tuple[torch.dtype, int]] = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        seen.append((q.dtype, q.shape[2]))
        return real_sdpa(q, *args, **kwargs)

    key, value = (torch.randn(rows, 3, width, 64, generator=gen) for _ in range(2))
    mask = torch.rand(rows, 1, 1, width, generator=gen) > 0.3
    mask[..., -1] = True
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    for q_length in (1, 3):
        query = torch.randn(rows, 9, q_length, 64, generator=gen)
        for wide in (mask, additive):
            wide = wide.expand(rows, 1, q_length, width)
            exact, _ = grouped_sdpa(module, query, key, value, wide)
            low = [t.to(torch.bfloat16) for t in (query, key, value)]
            seen.clear()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
                out, _ = grouped_sdpa(
                    module, *low, wide.to(torch.bfloat16) if wide.is_floating_point() else wide
                )
                grouped_sdpa(module, query, key, value, wide)  # float32
            assert out.dtype == torch.bfloat16 and out.shape == exact.shape
            expected = [(torch.float32, q_length)]
            assert seen == (expected if q_length == 1 else [(torch.bfloat16, 3), *expected])
            assert torch.allclose(out.float(), exact, atol=0.05)


def test_appends_in_place_match_concatenation_through_retirements_and_new_tensors(
    monkeypatch,
):
    """Columns appended into a layer's spare room read back as transformers' concatenation
    would give them, when rows leave (the layer's tensors cut to fewer rows), when a pass
    outgrows the room, and when the layer's tensors are replaced (the cache compacted)."""
    from transformers.cache_utils import DynamicLayer

    from conductor_pipeline.generation import kv_cache
    from conductor_pipeline.generation.kv_cache import append_columns

    monkeypatch.setattr(kv_cache, "SPARE_COLUMNS", 4)
    generator = torch.Generator().manual_seed(0)

    def columns(rows: int, n: int) -> torch.Tensor:
        return torch.randn(rows, 2, n, 3, generator=generator)

    layer = DynamicLayer()
    start_keys, start_values = columns(4, 5), columns(4, 5)
    layer.lazy_initialization(start_keys, start_values)
    layer.keys, layer.values = start_keys, start_values
    expected_keys, expected_values = start_keys, start_values
    buffers = set()
    for step, (rows, n) in enumerate([(4, 2), (4, 1), (3, 3), (3, 2), (3, 1), (3, 6), (2, 1)]):
        if step == 4:  # the cache compacted: new tensors (two columns fewer), not views
            layer.keys, layer.values = layer.keys[:, :, 2:].clone(), layer.values[:, :, 2:].clone()
            expected_keys, expected_values = expected_keys[:, :, 2:], expected_values[:, :, 2:]
        if rows < layer.keys.shape[0]:  # a row left: the batch is cut short
            layer.keys, layer.values = layer.keys[:rows], layer.values[:rows]
            expected_keys, expected_values = expected_keys[:rows], expected_values[:rows]
        keys, values = columns(rows, n), columns(rows, n)
        got_keys, got_values = append_columns(layer, keys, values)
        expected_keys = torch.cat([expected_keys, keys], dim=-2)
        expected_values = torch.cat([expected_values, values], dim=-2)
        assert torch.equal(got_keys, expected_keys) and torch.equal(got_values, expected_values)
        assert got_keys is layer.keys and got_values is layer.values
        buffers.add(layer.room[0].data_ptr())
    assert 1 < len(buffers) < 7  # appends reuse the room until it runs out or is replaced


def test_stacked_rows_are_right_aligned_over_zeros_and_keep_room_for_appends():
    from transformers.cache_utils import DynamicLayer

    from conductor_pipeline.generation.kv_cache import append_columns, stack_rows

    live_keys, live_values = torch.randn(2, 2, 5, 3), torch.randn(2, 2, 5, 3)
    new_keys, new_values = torch.randn(3, 2, 4, 3), torch.randn(3, 2, 4, 3)
    layer = DynamicLayer()
    layer.lazy_initialization(live_keys, live_values)
    layer.keys, layer.values = live_keys, live_values

    stack_rows(layer, new_keys, new_values, width=6)
    for got, live, new in (
        (layer.keys, live_keys, new_keys),
        (layer.values, live_values, new_values),
    ):
        assert got.shape == (5, 2, 6, 3)
        assert torch.equal(got[:2, :, 1:], live) and got[:2, :, :1].abs().sum() == 0
        assert torch.equal(got[2:, :, 2:], new) and got[2:, :, :2].abs().sum() == 0
    stacked_keys = layer.keys.clone()
    buffer = layer.room[0].data_ptr()
    added = torch.randn(5, 2, 2, 3)
    keys, _ = append_columns(layer, added, added)
    assert layer.room[0].data_ptr() == buffer  # the append used the room stacking left
    assert torch.equal(keys, torch.cat([stacked_keys, added], dim=-2))


def test_rows_joining_a_layer_with_free_rows_are_written_in_place():
    """Stacked once (new buffers with free rows), the next rows that join a batch as wide as
    theirs are written into the free rows: the live rows are not copied again."""
    from transformers.cache_utils import DynamicLayer

    from conductor_pipeline.generation.kv_cache import stack_rows

    layer = DynamicLayer()
    first_keys, first_values = torch.randn(2, 2, 6, 3), torch.randn(2, 2, 6, 3)
    layer.lazy_initialization(first_keys, first_values)
    layer.keys, layer.values = first_keys, first_values
    stack_rows(layer, torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3), width=6)
    buffer, live = layer.room[0].data_ptr(), layer.keys.clone()

    joining_keys, joining_values = torch.randn(2, 2, 5, 3), torch.randn(2, 2, 5, 3)
    stack_rows(layer, joining_keys, joining_values, width=6)
    assert layer.room[0].data_ptr() == buffer  # no new buffers: written in place
    assert layer.keys.shape == (5, 2, 6, 3) and torch.equal(layer.keys[:3], live)
    assert (
        torch.equal(layer.keys[3:, :, 1:], joining_keys) and layer.keys[3:, :, 0].abs().sum() == 0
    )
    assert torch.equal(layer.values[3:, :, 1:], joining_values)

    wider = torch.randn(1, 2, 8, 3)  # rows longer than the batch: the batch is widened
    stack_rows(layer, wider, wider, width=8)
    assert layer.room[0].data_ptr() != buffer
    assert torch.equal(layer.keys[:3, :, 2:], live) and layer.keys[:3, :, :2].abs().sum() == 0
    assert torch.equal(layer.keys[5], wider[0])


def test_a_packed_pass_attends_over_the_whole_buffers_as_over_the_layers_columns(monkeypatch):
    """A packed pass's cache update hands attention each row across all the columns of its
    buffers (contiguous, so the bfloat16 single-query products need not copy them): the
    columns past the layer's are zeros, and attention with the pass's mask answers what it
    answers over the layer's own columns, in bfloat16 (one query a row) and float32 (SDPA)."""
    from transformers.cache_utils import Cache, DynamicLayer

    from conductor_pipeline.generation import kv_cache
    from conductor_pipeline.generation.attention import PackedRows, grouped_sdpa
    from conductor_pipeline.generation.kv_cache import packed_cache

    monkeypatch.setattr(kv_cache, "SPARE_COLUMNS", 5)
    generator = torch.Generator().manual_seed(0)
    rows, columns = 3, 7
    packed_rows = PackedRows(torch.arange(rows), torch.zeros(rows, dtype=torch.long), rows, 1)
    mask = torch.rand(rows, 1, 1, columns + 1, generator=generator) > 0.3
    mask[..., -1] = True  # each row sees its new column
    for dtype in (torch.bfloat16, torch.float32):
        layer = DynamicLayer()
        keys, values = (torch.randn(rows, 3, columns, 64, generator=generator) for _ in range(2))
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys.to(dtype), values.to(dtype)
        new = torch.randn(1, 3, rows, 64, generator=generator, dtype=dtype)
        wide_keys, wide_values = packed_cache(Cache(layers=[layer]), packed_rows).update(
            new, new, 0
        )
        assert wide_keys.is_contiguous() and wide_keys.shape[2] > layer.keys.shape[2] == columns + 1
        assert torch.equal(wide_keys[:, :, : columns + 1], layer.keys)
        assert (
            wide_keys[:, :, columns + 1 :].abs().sum()
            == 0
            == wide_values[:, :, columns + 1 :].abs().sum()
        )

        query = torch.randn(rows, 9, 1, 64, generator=generator, dtype=dtype)
        wide, _ = grouped_sdpa(torch.nn.Module(), query, wide_keys, wide_values, mask)
        narrow, _ = grouped_sdpa(torch.nn.Module(), query, layer.keys, layer.values, mask)
        assert torch.equal(wide, narrow)
