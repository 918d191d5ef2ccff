"""The one decode loop (lookup decoding): guesses change how many forward passes a reply takes,
never its text; rows join and leave a batch without changing theirs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from conductor_pipeline.generation.decode import BatchLookupDecoder, NgramIndex
from tests.local_batches import complete_batch

# -- guesses --------------------------------------------------------------------------------


def test_a_guess_continues_the_latest_match_in_the_reply_before_any_source() -> None:
    index = NgramIndex([[1, 2, 3, 40, 41], [1, 2, 3, 50, 51]])
    # the reply (from position 3 on) already holds "1 2 3 60": the reply wins
    assert index.guess([9, 9, 9, 1, 2, 3, 60, 1, 2, 3], limit=2, reply_start=3) == [60, 1]
    # nothing in the reply: the first source that has the n-gram wins over later ones
    assert index.guess([9, 1, 2, 3], limit=5, reply_start=1) == [40, 41]


def test_longer_ngrams_win_and_the_guess_respects_its_limit() -> None:
    index = NgramIndex([[7, 2, 3, 10, 11, 12], [5, 6, 2, 3, 20, 21]])
    # "6 2 3" only occurs in the second source; "2 3" alone would pick the first
    assert index.guess([5, 6, 2, 3], limit=8) == [20, 21]
    assert index.guess([0, 2, 3], limit=1) == [10]
    assert index.guess([0, 2, 3], limit=0) == []


def test_no_match_or_a_too_short_context_guesses_nothing() -> None:
    index = NgramIndex([[1, 2, 3, 4]])
    assert index.guess([8, 9], limit=4) == []
    assert index.guess([2], limit=4) == []
    # a match at the very end of a source has no continuation to offer
    assert NgramIndex([[1, 2]]).guess([0, 1, 2], limit=4) == []


# -- prompt passes -------------------------------------------------------------------------


def test_prompts_join_in_groups_of_similar_length() -> None:
    from conductor_pipeline.generation.local import length_groups

    # eight sandbox prompts of 173-363 tokens: four passes, none padding a tenth of its tokens
    lengths = [221, 237, 175, 304, 363, 307, 173, 298]
    groups = length_groups(lengths)
    assert groups == [[6, 2], [0, 1], [7, 3, 5], [4]]
    assert sorted(i for g in groups for i in g) == list(range(8))
    for group in groups:
        tokens = sum(lengths[i] for i in group)
        assert max(lengths[i] for i in group) * len(group) - tokens <= 0.1 * tokens
    # a few pads cost less than a pass of their own
    assert length_groups([20, 40, 30]) == [[0, 2, 1]]
    assert length_groups([]) == [] and length_groups([5]) == [[0]]


# -- the same text as plain decoding, with the real SmolLM2 ---------------------------------


@pytest.fixture(scope="module")
def smollm2():
    from conductor_pipeline.workers.local_model import load_smollm2

    model, tokenizer = load_smollm2()
    model.eval()
    return model, tokenizer


_MESSAGES = [
    {
        "role": "user",
        "content": "Write three lines, each exactly like this one: "
        "model_id = [2], subtasks = ['Check the answer.'], access_list = [[0]]",
    }
]


@dataclass
class _Reply:
    tokens: list[int]
    forward_passes: int  # after the prompt's pass
    guessed: int  # guessed tokens that were kept


def _one_row(
    model, tokenizer, ids, temperature, seed, max_new_tokens, cache=None, cached=0, history=()
):
    """One request: a batch of one row, as a single request is served."""
    import torch

    decoder = BatchLookupDecoder(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    with torch.inference_mode():
        decoder.join(
            torch.tensor([ids]),
            torch.ones(1, len(ids), dtype=torch.long),
            cache,
            cached,
            temperature,
            [seed],
            max_new_tokens,
            [0],
            history,
        )
        while decoder.rows:
            decoder.step()
    [(_, tokens)] = decoder.pop_finished()
    return _Reply(tokens, decoder.passes, decoder.guessed)


def _plain(model, tokenizer, messages, temperature, seed, max_new_tokens):
    """Plain decoding, the reference: one token a pass through transformers' own model and
    cache (no guesses, no engine), drawn with the engine's draw from the row's generator."""
    import torch
    from transformers import DynamicCache

    from conductor_pipeline.generation.chat import encode_chat
    from conductor_pipeline.generation.token_draw import draw_token, row_generator

    ids, _ = encode_chat(tokenizer, messages)
    generator, tokens, cache, fed = row_generator(seed), [], DynamicCache(), ids
    with torch.inference_mode():
        while len(tokens) < max_new_tokens:
            out = model(input_ids=torch.tensor([fed]), past_key_values=cache, use_cache=True)
            tokens.append(draw_token(out.logits[0, -1], temperature, generator))
            if tokens[-1] == tokenizer.eos_token_id:
                break
            fed = tokens[-1:]
    return tokenizer.decode(tokens, skip_special_tokens=True).strip(), len(tokens)


def _lookup(model, tokenizer, messages, temperature, seed, max_new_tokens, history=()):
    from conductor_pipeline.generation.chat import encode_chat

    ids, _ = encode_chat(tokenizer, messages)
    return _one_row(model, tokenizer, ids, temperature, seed, max_new_tokens, history=history)


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, 0), (0.7, 1), (1.0, 3)])
def test_lookup_decoding_writes_the_text_plain_decoding_writes(smollm2, temperature, seed):
    model, tokenizer = smollm2
    text, completion_tokens = _plain(model, tokenizer, _MESSAGES, temperature, seed, 48)
    result = _lookup(model, tokenizer, _MESSAGES, temperature, seed, 48)
    assert tokenizer.decode(result.tokens, skip_special_tokens=True).strip() == text
    assert len(result.tokens) == completion_tokens


def test_a_reply_seen_before_takes_a_fraction_of_the_passes(smollm2):
    model, tokenizer = smollm2
    first = _lookup(model, tokenizer, _MESSAGES, 0.0, 0, 48)
    again = _lookup(model, tokenizer, _MESSAGES, 0.0, 0, 48, history=[first.tokens])
    assert again.tokens == first.tokens
    # every guess right: about one pass per eight tokens instead of one per token
    assert again.forward_passes <= len(again.tokens) // 4
    assert again.guessed >= len(again.tokens) // 2


def test_a_cached_prompt_opening_and_the_token_limit_are_honoured(smollm2):
    import torch
    from transformers import DynamicCache

    from conductor_pipeline.generation.chat import encode_chat

    model, tokenizer = smollm2
    ids, _ = encode_chat(tokenizer, _MESSAGES)
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[:20]]), past_key_values=cache, use_cache=True)
    result = _one_row(model, tokenizer, ids, 0.7, 5, 9, cache, 20)
    text, completion_tokens = _plain(model, tokenizer, _MESSAGES, 0.7, 5, 9)
    assert len(result.tokens) == completion_tokens == 9
    assert tokenizer.decode(result.tokens, skip_special_tokens=True).strip() == text
    with pytest.raises(ValueError, match="cached columns"):
        _one_row(model, tokenizer, ids, 0.0, 0, 4, cache, len(ids))


def test_the_head_projects_only_the_positions_a_draw_reads(smollm2):
    """The prompt's pass projects its last position onto the 49k-token vocabulary, not every
    prompt token; a guessing pass projects the newest token and the guess."""
    from conductor_pipeline.generation.chat import encode_chat

    model, tokenizer = smollm2
    ids, _ = encode_chat(tokenizer, _MESSAGES)
    fed, projected = [], []
    hooks = [
        model.model.register_forward_pre_hook(
            lambda _, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        ),
        model.lm_head.register_forward_pre_hook(
            lambda _, args: projected.append(args[0].shape[:-1].numel())
        ),
    ]
    try:
        _one_row(model, tokenizer, ids, 0.0, 0, 24, history=[ids[-30:]])
    finally:
        for hook in hooks:
            hook.remove()
    assert fed[0] == len(ids) and projected[0] == 1
    assert projected[1:] == fed[1:]
    assert max(fed[1:]) > 1  # some pass checked a guess


def test_a_local_policy_answers_single_requests_as_its_batches_do_and_learns_to_guess():
    import asyncio

    from conductor_pipeline.workflow.policy import LocalPolicy

    policy = LocalPolicy(torch_threads=1)
    batched = asyncio.run(
        complete_batch(policy, [_MESSAGES], temperature=0.7, max_tokens=40, seeds=[11])
    )[0]
    passes = policy.forward_passes
    single = asyncio.run(policy.complete(_MESSAGES, temperature=0.7, max_tokens=40, seed=11))
    assert (single.text, single.completion_tokens) == (batched.text, batched.completion_tokens)
    # the batched reply is in the policy's recent replies, so the single one is guessed
    assert policy.forward_passes - passes <= single.completion_tokens // 3
    with pytest.raises(ValueError, match="lookup_tokens"):
        LocalPolicy(lookup_tokens=-1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_policy_guesses_from_earlier_replies_in_either_precision(tiny_model_dir, dtype):
    """Served Conductors keep their recent replies to guess from whatever the precision (in
    bfloat16 that costs a request's independence from the requests before it, documented in
    docs/serving.md); with ``lookup_tokens=0`` every pass writes one token, and a repeated
    request writes the same text."""
    import asyncio

    from conductor_pipeline.workflow.policy import LocalPolicy

    policy = LocalPolicy(model_dir=tiny_model_dir, torch_threads=1, dtype=dtype)
    asyncio.run(policy.complete(_MESSAGES, temperature=0.7, max_tokens=8, seed=1))
    asyncio.run(policy.complete(_MESSAGES, temperature=0.7, max_tokens=8, seed=1))
    assert len(policy.engine.recent_replies) == 2
    # a 0-token request writes nothing and leaves the replies to guess from as they were
    empty = asyncio.run(policy.complete(_MESSAGES, temperature=0.7, max_tokens=0, seed=1))
    assert (empty.text, empty.completion_tokens) == ("", 0)
    assert len(policy.engine.recent_replies) == 2
    plain = LocalPolicy(model_dir=tiny_model_dir, torch_threads=1, dtype=dtype, lookup_tokens=0)
    first = asyncio.run(plain.complete(_MESSAGES, temperature=0.7, max_tokens=8, seed=1))
    again = asyncio.run(plain.complete(_MESSAGES, temperature=0.7, max_tokens=8, seed=1))
    assert first.text == again.text and first.completion_tokens > 0


def test_an_engine_without_reply_history_keeps_no_replies(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from conductor_pipeline.generation.local import LocalEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = LocalEngine(model, eos_token_id=0, pad_token_id=0, reply_history=0)
    engine.generate([[5, 6, 7, 8]], 0.7, 4, [1], max_guess=4)
    assert len(engine.recent_replies) == 0


def test_rows_repeating_a_prompt_share_its_prompt_pass_and_write_their_own_texts(tiny_model_dir):
    """A GRPO group: several rows on one prompt. The prompt runs once for all of them, and
    each row writes what it writes alone with its seed."""
    from transformers import AutoModelForCausalLM

    from conductor_pipeline.generation.local import LocalEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 12]]
    rows = [prompts[0]] * 3 + [prompts[1]] * 2
    fed = []  # rows of each prompt pass (more than one token a row)
    hook = model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: (
            fed.append(kwargs["input_ids"].shape[0]) if kwargs["input_ids"].shape[1] > 1 else None
        ),
        with_kwargs=True,
    )
    engine = LocalEngine(model, eos_token_id=[1, 2], pad_token_id=0)
    try:
        together = engine.generate(rows, 1.0, 6, seeds=[1, 2, 3, 4, 5], max_guess=0)
    finally:
        hook.remove()
    assert sum(fed) == len(prompts)
    alone = [
        LocalEngine(model, [1, 2], 0).generate([r], 1.0, 6, seeds=[s], max_guess=0)[0]
        for r, s in zip(rows, [1, 2, 3, 4, 5], strict=True)
    ]
    assert together == alone
    assert len({tuple(t) for t in together[:3]}) > 1  # a group's rows drew their own texts


# -- batches --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_policy():
    from conductor_pipeline.workflow.policy import LocalPolicy

    policy = LocalPolicy(torch_threads=1)
    policy.load()
    return policy


def _batch_conversations() -> list[list[dict[str, str]]]:
    from conductor_pipeline.workflow.prompts import PromptConfig, conductor_messages

    questions = [
        "Compute the sum of 1234 and 4321.",
        "Are all cats mammals? Yes or No.",
        "Write a Python function that reverses a string.",
    ]
    # planning prompts without the few-shot examples: 217 tokens instead of 1,127, a fifth
    # of the prefill, and still replies that copy from their prompt (what guesses feed on)
    planning = [
        conductor_messages(q, ["a", "b", "c"], PromptConfig(few_shot=[])) for q in questions
    ]
    # a row whose reply repeats itself (well guessed) and one that ends early
    return [*planning, _MESSAGES, [{"role": "user", "content": "Say OK."}]]


def _prompt_groups(policy, conversations) -> list[list[int]]:
    """The groups of similar length in which the engine passes over these prompts."""
    from conductor_pipeline.generation.chat import encode_chat
    from conductor_pipeline.generation.local import length_groups

    rows = [encode_chat(policy.tokenizer, c)[0] for c in conversations]
    opening = policy.engine.shared_prefix(rows)
    return length_groups([len(r) - opening for r in rows])


# greedy, and sampling at full temperature (where guesses are refused most often)
@pytest.mark.parametrize(("temperature", "seeds"), [(0.0, [0] * 5), (1.0, [21, 22, 23, 24, 25])])
def test_batches_with_guesses_write_the_texts_of_plain_batches(local_policy, temperature, seeds):
    import asyncio

    conversations = _batch_conversations()

    def run(lookup_tokens: int) -> tuple[list, int]:
        local_policy.lookup_tokens = lookup_tokens
        before = local_policy.forward_passes
        out = asyncio.run(
            complete_batch(
                local_policy, conversations, temperature=temperature, max_tokens=40, seeds=seeds
            )
        )
        return out, local_policy.forward_passes - before

    try:
        plain, plain_passes = run(0)
        guessed, guessed_passes = run(8)
    finally:
        local_policy.lookup_tokens = 8
    assert [c.text for c in guessed] == [c.text for c in plain]
    assert [c.completion_tokens for c in guessed] == [c.completion_tokens for c in plain]
    lengths = [c.completion_tokens for c in plain]
    assert len(set(lengths)) > 1 and max(lengths) == 40  # rows of different lengths, one cut
    # without guesses: a pass per group of prompts of similar length (each draws its rows'
    # first tokens), then one pass per further token of the longest row
    assert plain_passes == len(_prompt_groups(local_policy, conversations)) + max(lengths) - 1
    assert guessed_passes < plain_passes


def test_rows_drawing_side_by_side_write_the_texts_of_rows_drawing_in_turn(
    local_policy, monkeypatch
):
    """With two CPU threads a batch's rows draw their tokens on a thread pool; each row has
    its own generator, so the texts are the ones drawn one row after another."""
    import asyncio

    conversations = _batch_conversations()

    def run() -> list:
        return asyncio.run(
            complete_batch(
                local_policy, conversations, temperature=1.0, max_tokens=30, seeds=[4, 3, 2, 1, 0]
            )
        )

    with monkeypatch.context() as two_threads:
        two_threads.setattr(local_policy, "torch_threads", 2)
        pool = local_policy._draw_threads()
    assert pool is not None
    # the passes stay on one thread: on two cores shared with the other test process, passes
    # on two OpenMP threads took 42 s instead of 5 (the draws are what is compared)
    drawn, pool_map = [], pool.map

    def counted_map(*args):
        drawn.append(args)
        return pool_map(*args)

    monkeypatch.setattr(pool, "map", counted_map)
    monkeypatch.setattr(local_policy, "_draw_threads", lambda: pool)
    side_by_side = run()
    assert drawn  # the rows drew on the pool
    monkeypatch.setattr(local_policy, "_draw_threads", lambda: None)
    in_turn = run()
    assert [c.text for c in side_by_side] == [c.text for c in in_turn]
    assert [c.completion_tokens for c in side_by_side] == [c.completion_tokens for c in in_turn]


def test_every_row_keeps_its_positions_in_step_with_its_visible_columns(
    tiny_model_dir, monkeypatch
):
    """Positions follow the mask: after every pass, each row's next position is the number
    of cache columns it sees, for rows that joined a writing batch (with the kept opening
    and without) and after the cache was compacted."""
    import asyncio

    from conductor_pipeline.generation import decode
    from conductor_pipeline.workflow import LocalPolicy
    from conductor_pipeline.workflow.prompts import PromptConfig, conductor_messages

    def planning(question: str) -> list[dict[str, str]]:
        return conductor_messages(question, ["a", "b", "c"], PromptConfig(few_shot=[]))

    policy = LocalPolicy(model_dir=tiny_model_dir, lookup_tokens=4)
    policy.warm_up([planning("What is 2 + 2?"), planning("Is ice cold?")])
    monkeypatch.setattr(decode, "_MAX_HIDDEN", 8)  # compact now and then
    step, checked = BatchLookupDecoder.step, []

    def checked_step(decoder: BatchLookupDecoder) -> None:
        step(decoder)
        if decoder._rows:
            assert decoder._next_position.tolist() == decoder._mask.sum(dim=1).tolist()
            checked.append(len(decoder._rows))

    monkeypatch.setattr(BatchLookupDecoder, "step", checked_step)
    joins = {2: [planning("Name a prime.")], 3: [[{"role": "user", "content": "Hi!"}]]}
    asked: list[int] = []

    def more(writing: int) -> list:
        asked.append(writing)
        return [(len(asked) * 10 + i, m, i) for i, m in enumerate(joins.get(len(asked), []))]

    first = [(0, planning("Compute 12 * 12."), 1), (1, planning("Is 7 odd?"), 2)]
    answers: dict = {}
    asyncio.run(
        policy.complete_continuously(
            first,
            temperature=1.0,
            max_tokens=24,
            more=more,
            done=lambda handle, completion: answers.__setitem__(handle, completion),
        )
    )
    assert sorted(answers) == [0, 1, 20, 30]
    assert max(checked) == 4  # the joining rows wrote beside the first two


def test_a_batch_pass_feeds_and_projects_only_the_tokens_its_rows_were_fed(local_policy):
    """Rows guess different lengths: a decoding pass feeds the model their tokens packed, no
    pads (the padded layout is only attention's), and the head (49k wide) projects exactly
    those tokens."""
    import asyncio

    policy = local_policy
    model = policy.model
    # the opening these prompts share, kept first: other tests on this policy may have kept
    # another one, and computing it is a pass of its own (no mask, not a batch pass)
    asyncio.run(
        complete_batch(policy, _batch_conversations(), temperature=1.0, max_tokens=1, seeds=[1] * 5)
    )
    passes = []  # (tokens fed, rows x width of the padded layout)
    projected = []  # (dimensions of the head's input, positions it projects)

    def count_fed(_, args, kwargs) -> None:  # noqa: ANN001
        mask = kwargs["attention_mask"]
        padded = mask.shape[0] * mask.shape[2] if mask.dim() == 4 else None
        passes.append((kwargs["input_ids"].numel(), padded))

    hooks = [
        model.get_decoder().register_forward_pre_hook(count_fed, with_kwargs=True),
        model.get_output_embeddings().register_forward_pre_hook(
            lambda _, args: projected.append((args[0].dim(), args[0].shape[:-1].numel()))
        ),
    ]
    try:
        asyncio.run(
            complete_batch(
                policy,
                _batch_conversations(),
                temperature=1.0,
                max_tokens=30,
                seeds=[1, 2, 3, 4, 5],
            )
        )
    finally:
        for hook in hooks:
            hook.remove()
    assert len(projected) == len(passes) and all(dims == 2 for dims, _ in projected)
    prompts = [(p, n) for p, (_, n) in zip(passes, projected, strict=True) if p[1] is None]
    steps = [(p, n) for p, (_, n) in zip(passes, projected, strict=True) if p[1] is not None]
    # each prompt pass (one per group of similar length) projects its rows' last positions,
    # as one matrix (rows x hidden)
    groups = _prompt_groups(policy, _batch_conversations())
    assert sorted(n for _, n in prompts) == sorted(len(g) for g in groups)
    assert steps and all(fed == n for (fed, _), n in steps)
    assert any(fed < padded for (fed, padded), _ in steps)  # rows fed different lengths


def test_packed_and_padded_passes_give_the_same_tokens(local_policy):
    """The packed pass is an implementation detail: forced back to padded passes, a batch
    writes the same tokens (and the packed pass really is the one used by default)."""
    import torch

    from conductor_pipeline.generation.chat import encode_chat

    policy = local_policy
    rows = [encode_chat(policy.tokenizer, c)[0] for c in _batch_conversations()]

    def decode(packed: bool) -> list[list[int]]:
        decoder = BatchLookupDecoder(
            policy.model, policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id, 8
        )
        assert decoder._packed  # the real model attends with the grouped SDPA
        decoder._packed = packed
        engine = policy.engine
        input_ids, attention_mask, shared = engine.padded(rows)
        seeds = [5, 6, 7, 8, 9]
        with torch.inference_mode():
            cache = engine.prefix_cache(rows[0][:shared], len(rows)) if shared else None
            decoder.join(input_ids, attention_mask, cache, shared, 1.0, seeds, 30, range(len(rows)))
            while decoder.rows:
                decoder.step()
        return [tokens for _, tokens in sorted(decoder.pop_finished())]

    assert decode(True) == decode(False)


@pytest.mark.parametrize("leaving", [[0], [4], [1, 3], [0, 1], [3, 4], [0, 2, 4], [0, 1, 2, 3, 4]])
def test_rows_that_finish_leave_with_their_keys_values_mask_and_positions(leaving):
    """The batch's last rows move into the places of rows that finish: every row that stays
    keeps its own keys, values, mask and position, and the finished ones are reported."""
    import torch
    from transformers import DynamicCache

    from conductor_pipeline.generation.decode import _Row

    eos, rows = 2, 5
    cache = DynamicCache()
    for layer in range(3):  # row r's keys are all r, its values all -r
        keys = torch.arange(rows, dtype=torch.float32).view(rows, 1, 1, 1).expand(rows, 2, 6, 4)
        cache.update(keys.clone(), -keys.clone(), layer)
    decoder = BatchLookupDecoder(None, eos, 0)
    decoder._cache = cache
    decoder._mask = torch.tensor([[1] * (6 - r) + [0] * r for r in range(rows)])
    decoder._next_position = torch.arange(rows) * 10
    decoder._rows = [
        _Row(r, [1], 1.0, 1.0, None, 8, None, [eos if r in leaving else 7]) for r in range(rows)
    ]
    with torch.inference_mode():
        decoder._retire()
    assert sorted(key for key, _ in decoder.pop_finished()) == leaving
    staying = [row.key for row in decoder._rows]
    assert sorted(staying) == [r for r in range(rows) if r not in leaving]
    if not staying:
        assert decoder._cache is None and decoder.rows == 0
        return
    for j, r in enumerate(staying):
        for layer in decoder._cache.layers:
            assert torch.all(layer.keys[j] == r) and torch.all(layer.values[j] == -r)
        assert decoder._mask[j].sum() == 6 - r
        assert decoder._next_position[j] == 10 * r
    assert decoder._cache.layers[0].keys.shape[0] == len(staying) == decoder._mask.shape[0]
