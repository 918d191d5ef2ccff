"""The Conductor's GRPO trainer on a CPU gives stock TRL's numbers.

One trainer on the tiny random Llama, with LoRA on q/k/v/o of its last layer only (the
sandbox shape: LoRA on the last layers) and without dropout, so that its grouped scoring and
stock ``GRPOTrainer`` can be compared on the same model: per-token log-probabilities,
entropies and LoRA gradients, for groups whose prompts differ in length, with and without
the states an earlier scoring pass recorded; rollouts written by the generation engine
through TRL's ``rollout_func`` (greedy at a tiny temperature, end tokens, length limit), and
TRL's own generation where the engine does not apply.
"""

from __future__ import annotations

import functools

import pytest
import torch

from conductor_pipeline.generation.local import MIN_SHARED_PREFIX
from conductor_pipeline.training.models import conductor_trainer_class
from conductor_pipeline.training.rollouts import engine_rollouts, engine_rollouts_blocker

MAX_COMPLETION = 10
GROUP = 3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model gains nothing from threads, and on a busy 2-core box OpenMP threads
    waiting on each other make every small matmul ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, one_thread):
    return _trainer(tiny_model_dir, torch.float32)


def _trainer(tiny_model_dir, dtype: torch.dtype):
    """The project's trainer on the tiny Llama with its base in ``dtype`` (bfloat16: training
    in bfloat16 autocast, as ``training.grpo.model_dtype: auto`` has it on such a CPU)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    args = GRPOConfig(
        output_dir=str(tiny_model_dir.parent / f"fast-path-{dtype}"),
        use_cpu=True,
        bf16=dtype == torch.bfloat16,
        gradient_checkpointing=False,
        report_to="none",
        num_generations=GROUP,
        per_device_train_batch_size=2 * GROUP,
        max_completion_length=MAX_COMPLETION,
        temperature=0.7,
        disable_tqdm=True,
        seed=0,
    )
    return conductor_trainer_class()(
        model=model,
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "hello"}] * 2 * GROUP),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            layers_to_transform=[1],
            init_lora_weights=False,  # random A and B: every LoRA weight gets a gradient
            task_type="CAUSAL_LM",
        ),
    )


def _stock(trainer, name):
    from trl import GRPOTrainer

    return functools.partial(getattr(GRPOTrainer, name), trainer)


def _tokens(generator, n):
    return torch.randint(100, 5000, (n,), generator=generator).tolist()


def _prompts(shared: int, tails=(5, 11)) -> list[list[int]]:
    """Distinct prompts of different lengths opening with ``shared`` common tokens."""
    generator = torch.Generator().manual_seed(len(tails) + shared)
    opening = _tokens(generator, shared)
    return [opening + _tokens(generator, n) for n in tails]


def _rows(prompts, completions, pad):
    """TRL's layout: left-padded prompts, right-padded completions; returns the loss inputs."""
    width_p = max(len(p) for p in prompts)
    width_c = max(max(len(c) for c in completions), 1)
    prompt_ids = torch.full((len(prompts), width_p), pad)
    prompt_mask = torch.zeros_like(prompt_ids)
    completion_ids = torch.full((len(prompts), width_c), pad)
    completion_mask = torch.zeros_like(completion_ids)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        prompt_ids[i, width_p - len(p) :] = torch.tensor(p)
        prompt_mask[i, width_p - len(p) :] = 1
        if c:
            completion_ids[i, : len(c)] = torch.tensor(c)
            completion_mask[i, : len(c)] = 1
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
    }


def _scoring_args(rows):
    input_ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
    mask = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
    return input_ids, mask, rows["completion_ids"].size(1)


def _shuffled_batch(trainer, prompts):
    """``GROUP`` rows per prompt with random completions, shuffled as TRL shuffles them
    before the loss."""
    repeated = [p for p in prompts for _ in range(GROUP)]
    generator = torch.Generator().manual_seed(1)
    lengths = [7, 1, 4, 0, 7, 2]  # a one-token and an all-masked (empty) completion
    completions = [_tokens(generator, lengths[i % len(lengths)]) for i in range(len(repeated))]
    order = torch.randperm(len(repeated), generator=torch.Generator().manual_seed(2)).tolist()
    return _rows(
        [repeated[i] for i in order],
        [completions[i] for i in order],
        trainer.processing_class.pad_token_id,
    )


@pytest.mark.parametrize(
    ("shared", "recorded"),
    # an opening long enough to run once for all prompts
    [(MIN_SHARED_PREFIX + 8, False), (0, False), (MIN_SHARED_PREFIX + 8, True)],
    ids=["shared-opening", "no-shared-opening", "states-from-an-earlier-pass"],
)
def test_log_probs_and_entropies_equal_stock_trl(trainer, shared, recorded):
    rows = _shuffled_batch(trainer, _prompts(shared))
    input_ids, mask, width = _scoring_args(rows)
    stock = _stock(trainer, "_get_per_token_logps_and_entropies")
    trainer.frozen_states = None
    with torch.no_grad():
        if recorded:  # a first pass records the states entering the LoRA layer
            trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, mask, width)
            assert trainer.frozen_states is not None and trainer.frozen_states.uses == 0
        calls = dict(trainer.fast_path_calls)
        ours = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, mask, width, batch_size=4, compute_entropy=True
        )
        theirs = stock(trainer.model, input_ids, mask, width, compute_entropy=True)
    assert trainer.fast_path_calls["scoring"] == calls["scoring"] + 1
    if recorded:
        assert trainer.frozen_states.uses == 1  # started from the recorded states
    assert bool((theirs[0] != 0).any())
    torch.testing.assert_close(ours[0], theirs[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-4, rtol=1e-5)


def test_scoring_starts_from_the_states_recorded_while_generating(trainer):
    """The engine records the states entering the LoRA layer as it writes the rollouts;
    scoring them starts there and still gives stock TRL's numbers."""
    texts = ["hello there", "a somewhat longer prompt for the second group of rollouts"]
    out = trainer.rollout_func([t for t in texts for _ in range(GROUP)], trainer)
    states = trainer.frozen_states
    assert states is not None and states.layer == 1 and states.uses == 0
    order = torch.randperm(len(out["prompt_ids"]), generator=torch.Generator().manual_seed(4))

    rows = _rows(
        [out["prompt_ids"][i] for i in order],
        [out["completion_ids"][i] for i in order],
        trainer.processing_class.pad_token_id,
    )
    input_ids, mask, width = _scoring_args(rows)
    with torch.no_grad():
        ours = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, mask, width, compute_entropy=True
        )
        theirs = _stock(trainer, "_get_per_token_logps_and_entropies")(
            trainer.model, input_ids, mask, width, compute_entropy=True
        )
    assert trainer.frozen_states is states and states.uses == 1
    torch.testing.assert_close(ours[0], theirs[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-4, rtol=1e-5)


def test_a_bfloat16_base_writes_rollouts_and_scores_them_from_the_recorded_states(
    tiny_model_dir, one_thread
):
    """A base loaded in bfloat16 under a float32 LoRA (``model_dtype: auto`` where the CPU
    multiplies bfloat16): the engine writes the rollouts in bfloat16, records the states
    entering the LoRA layer, and scoring from them gives stock TRL's numbers on the same
    model, to bfloat16's precision."""
    bf16 = _trainer(tiny_model_dir, torch.bfloat16)
    lora = {p.dtype for n, p in bf16.model.named_parameters() if "lora_" in n}
    assert lora == {torch.float32} and bf16.model.get_base_model().dtype == torch.bfloat16
    texts = ["hello there", "a somewhat longer prompt for the second group of rollouts"]
    out = bf16.rollout_func([t for t in texts for _ in range(GROUP)], bf16)
    assert bf16.fast_path_calls["generation"] == 1
    assert bf16.frozen_states.prompts and all(
        s.dtype == torch.bfloat16 for s in bf16.frozen_states.rollouts.values()
    )
    rows = _rows(out["prompt_ids"], out["completion_ids"], bf16.processing_class.pad_token_id)
    input_ids, mask, width = _scoring_args(rows)
    with torch.no_grad(), bf16.accelerator.autocast():
        ours = bf16._get_per_token_logps_and_entropies(bf16.model, input_ids, mask, width)
        theirs = _stock(bf16, "_get_per_token_logps_and_entropies")(
            bf16.model, input_ids, mask, width
        )
    assert bf16.frozen_states.uses == 1 and bool((theirs[0] != 0).any())
    torch.testing.assert_close(ours[0], theirs[0], atol=0.03, rtol=0)


@pytest.mark.parametrize("recorded", [False, True], ids=["one-pass", "states-from-an-earlier-pass"])
def test_lora_gradients_of_the_loss_equal_stock_trl(trainer, monkeypatch, recorded):
    rows = _shuffled_batch(trainer, _prompts(MIN_SHARED_PREFIX + 8))
    advantages = torch.randn(rows["prompt_ids"].size(0), generator=torch.Generator().manual_seed(3))
    inputs = {
        **rows,
        "advantages": advantages,
        "num_items_in_batch": rows["completion_mask"].sum(),
    }
    # set by Trainer.train for each step; compute_loss reads it
    monkeypatch.setattr(trainer, "current_gradient_accumulation_steps", 1, raising=False)
    lora = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n and ".layers.1." in n for n in lora)
    trainer.frozen_states = None
    if recorded:
        with torch.no_grad():
            trainer._get_per_token_logps_and_entropies(trainer.model, *_scoring_args(rows))

    def gradients():
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, inputs).backward()
        return {n: p.grad.clone() for n, p in lora.items()}

    calls = trainer.fast_path_calls["scoring"]
    ours = gradients()
    assert trainer.fast_path_calls["scoring"] == calls + 1
    if recorded:
        assert trainer.frozen_states.uses == 1
    monkeypatch.setattr(
        trainer,
        "_get_per_token_logps_and_entropies",
        _stock(trainer, "_get_per_token_logps_and_entropies"),
    )
    theirs = gradients()
    assert all(bool(g.abs().sum() > 0) for g in theirs.values())
    for name in lora:
        torch.testing.assert_close(ours[name], theirs[name], atol=1e-6, rtol=1e-4, msg=name)


def _greedy(model, prompt, eos):
    """transformers' own greedy decoding of one prompt, cut after its first EOS."""
    out = model.generate(
        input_ids=torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=MAX_COMPLETION,
        eos_token_id=eos,
        pad_token_id=eos[0],
    )[0, len(prompt) :].tolist()
    ends = [i for i, token in enumerate(out) if token in eos]
    return out[: ends[0] + 1] if ends else out


ROLLOUT_TEXTS = ["hello there", "a somewhat longer prompt for the second group of rollouts"]


def _greedy_groups(trainer):
    """``ROLLOUT_TEXTS`` repeated once per rollout of a group, their prompt ids and each
    prompt's greedy completion."""
    repeated = [t for t in ROLLOUT_TEXTS for _ in range(GROUP)]
    eos = list(trainer.eos_token_ids)
    prompt_ids = [trainer.processing_class(text=t)["input_ids"] for t in ROLLOUT_TEXTS]
    return repeated, prompt_ids, [_greedy(trainer.model, p, eos) for p in prompt_ids]


def test_rollouts_come_from_the_engine_greedy_at_a_tiny_temperature_and_stop_like_trl(
    trainer, monkeypatch
):
    assert trainer.rollout_func is engine_rollouts
    monkeypatch.setattr(trainer, "temperature", 1e-7)
    eos = list(trainer.eos_token_ids)
    repeated, prompt_ids, greedy = _greedy_groups(trainer)
    calls = trainer.fast_path_calls["generation"]
    out = trainer.rollout_func(repeated, trainer)
    assert trainer.fast_path_calls["generation"] == calls + 1 and out["logprobs"] is None
    assert out["prompt_ids"] == [prompt_ids[i // GROUP] for i in range(len(repeated))]
    assert out["completion_ids"] == [greedy[i // GROUP] for i in range(len(repeated))]

    # a token the greedy completion writes third becomes an end token: every row stops at
    # its first occurrence, kept, as TRL's own generation stops
    stop = greedy[0][2]
    monkeypatch.setattr(trainer, "eos_token_ids", [*eos, stop])
    completions = trainer.rollout_func(repeated, trainer)["completion_ids"]
    assert completions[0] == greedy[0][: greedy[0].index(stop) + 1]
    for completion in completions:
        assert all(isinstance(t, int) for t in completion)
        ends = [i for i, t in enumerate(completion) if t in (*eos, stop)]
        assert ends == [len(completion) - 1] or (not ends and len(completion) == MAX_COMPLETION)


def test_rollouts_draw_from_the_trainers_top_p_nucleus(trainer, monkeypatch):
    """At temperature 1.0 a nucleus of one token leaves only the likeliest: greedy text. The
    sandbox samples with top-p 0.95, so rollouts that ignored ``top_p`` would differ."""
    monkeypatch.setattr(trainer, "temperature", 1.0)
    monkeypatch.setattr(trainer, "top_p", 1e-6)
    repeated, _, greedy = _greedy_groups(trainer)
    out = trainer.rollout_func(repeated, trainer)
    assert out["completion_ids"] == [greedy[i // GROUP] for i in range(len(repeated))]

    monkeypatch.setattr(trainer, "top_p", 1.0)
    sampled = trainer.rollout_func(repeated, trainer)["completion_ids"]
    assert sampled != out["completion_ids"]  # the whole distribution: no longer greedy


def test_trl_generates_where_the_engine_does_not_apply(trainer, tiny_model_dir):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    def config(**changes):
        return GRPOConfig(
            output_dir=str(tiny_model_dir.parent / "blocker"),
            use_cpu=True,
            report_to="none",
            **changes,
        )

    assert engine_rollouts_blocker(config()) is None
    assert engine_rollouts_blocker(config(top_k=5)) == "sampling beyond temperature and top-p"
    assert engine_rollouts_blocker(config(repetition_penalty=1.1)) is not None
    assert engine_rollouts_blocker(config(), tools=[len]) == "tools"
    other = conductor_trainer_class()(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
        args=config(top_k=5, num_generations=GROUP, per_device_train_batch_size=GROUP),
        train_dataset=Dataset.from_list([{"prompt": "hello"}] * GROUP),
        processing_class=trainer.processing_class,
    )
    assert other.rollout_func is None  # TRL's own generation
