"""The warm start's CPU loss equals TRL's, and its examples are the planner's replies."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")


def _batch(tokenizer, rows):
    """A right-padded batch as TRL's collator builds it: labels -100 on prompt and padding."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(p) + len(c) for p, c in rows)
    ids, mask, labels = [], [], []
    for prompt, completion in rows:
        seq = prompt + completion
        fill = width - len(seq)
        ids.append(seq + [pad] * fill)
        mask.append([1] * len(seq) + [0] * fill)
        labels.append([-100] * len(prompt) + completion + [-100] * fill)
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(mask),
        "labels": torch.tensor(labels),
    }


def test_completion_loss_and_gradients_equal_the_full_logits_loss(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_pipeline.training.sft import completion_loss

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # prompts of different lengths, so the earliest completion start differs per row
    rows = [
        (list(range(10, 40)), list(range(500, 512))),
        (list(range(60, 75)), list(range(700, 705))),
        (list(range(80, 130)), list(range(900, 903))),
    ]
    batch = _batch(tokenizer, rows)

    fast = completion_loss(model, batch)
    fast.backward()
    fast_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()

    # reference: every position's logits, the usual shifted cross-entropy
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    reference = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
    )
    reference.backward()
    ref_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]

    assert torch.allclose(fast, reference, atol=1e-5), (fast, reference)
    assert len(fast_grads) == len(ref_grads)
    for a, b in zip(fast_grads, ref_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    # the token count TRL passes wins over the batch's own count
    halved = completion_loss(model, batch, num_items=2 * int((batch["labels"] != -100).sum()))
    assert torch.allclose(halved, fast.detach() / 2, atol=1e-6)


def test_an_example_seen_again_skips_the_frozen_layers_and_keeps_its_loss(tiny_model_dir):
    """With LoRA on the last layer only, the loss from recorded states equals the loss of a
    whole forward pass, gradients too: the first pass over an example records its states,
    a batch of examples seen before skips the frozen layer, and a batch mixing seen and new
    examples takes the whole pass and records the new ones."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_pipeline.training.sft import completion_loss

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], layers_to_transform=[1])
    model = get_peft_model(base, config)
    for name, param in model.named_parameters():  # a trained adapter: B is not zero
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    rows = [
        (list(range(10, 40)), list(range(500, 512))),
        (list(range(60, 75)), list(range(700, 705))),
        (list(range(80, 130)), list(range(900, 903))),
    ]
    batch = _batch(tokenizer, rows)
    runs = []
    base.model.layers[0].register_forward_hook(lambda m, a, out: runs.append(a[0].shape[0]))

    def loss_and_grads(states):
        model.zero_grad()
        loss = completion_loss(model, batch, frozen_states=states)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    reference, reference_grads = loss_and_grads(None)
    assert runs == [3]
    states: dict = {}
    for _ in range(2):
        loss, grads = loss_and_grads(states)
        assert torch.allclose(loss, reference, atol=1e-5), (loss, reference)
        assert len(grads) == len(reference_grads) == 4  # A and B of q and v in layer 1
        for a, b in zip(grads, reference_grads, strict=True):
            assert torch.allclose(a, b, atol=1e-5)
    assert runs == [3, 3] and len(states) == 3  # the second call started at layer 1
    # one seen example beside a new one: the whole pass, which records the new one
    mixed = _batch(tokenizer, [rows[0], (list(range(200, 220)), list(range(300, 310)))])
    completion_loss(model, mixed, frozen_states=states)
    assert runs == [3, 3, 2] and len(states) == 4


def test_the_frozen_states_stay_out_of_batches_they_cannot_serve(tiny_model_dir):
    """No frozen layer (every layer trained) or left padding: the whole forward pass."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_pipeline.training.sft import completion_loss

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    everywhere = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]))
    batch = _batch(tokenizer, [(list(range(10, 20)), [500, 501]), (list(range(30, 35)), [7])])
    states: dict = {}
    completion_loss(everywhere, batch, frozen_states=states)
    assert states == {}
    last = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(
        last, LoraConfig(r=4, target_modules=["q_proj"], layers_to_transform=[1])
    )
    pads = (batch["attention_mask"] == 0).sum(dim=1).tolist()  # the same rows, pads first
    left = {k: torch.stack([v[i].roll(n) for i, n in enumerate(pads)]) for k, v in batch.items()}
    completion_loss(model, left, frozen_states=states)
    assert states == {}


def test_sft_examples_are_planner_replies_to_the_training_prompt():
    from conductor_pipeline.training.configs import SFTSettings
    from conductor_pipeline.training.planner import ReferencePlanner
    from conductor_pipeline.training.sft import build_sft_examples
    from conductor_pipeline.workflow import PromptConfig, conductor_messages

    from .fakes import make_task

    tasks = [make_task(i, i, 2) for i in range(6)]
    settings = SFTSettings(n_examples=4)
    config = PromptConfig(question_to_workers=True, few_shot=[])
    rows = build_sft_examples(tasks, ["a", "b", "c"], ["", "", ""], config, settings, seed=3)
    planner = ReferencePlanner(["a", "b", "c"], settings, seed=3, question_to_workers=True)
    by_id = {t.id: t for t in tasks}
    assert len(rows) == 4
    for row in rows:
        task = by_id[row["task_id"]]
        assert row["prompt"] == conductor_messages(task.question, ["", "", ""], config)
        assert row["completion"][0]["content"] == planner.plan(task).text


def test_with_model_id_last_the_examples_write_the_worker_ids_after_the_other_lists():
    from conductor_pipeline.training.configs import SFTSettings
    from conductor_pipeline.training.planner import ReferencePlanner
    from conductor_pipeline.workflow import parse_workflow

    from .fakes import make_task

    tasks = [make_task(i, i, 2) for i in range(8)]
    usual = ReferencePlanner(["a", "b", "c"], SFTSettings(), seed=3, question_to_workers=True)
    last = ReferencePlanner(
        ["a", "b", "c"], SFTSettings(model_id_last=True), seed=3, question_to_workers=True
    )
    for task in tasks:
        plan, reordered = usual.plan(task), last.plan(task)
        labels = [line.split(" = ")[0] for line in reordered.text.splitlines()[1:]]
        assert labels == ["subtasks", "access_list", "model_id"]
        assert parse_workflow(reordered.text, 3, positional_access=True) == plan.workflow
        assert sorted(reordered.text.splitlines()) == sorted(plan.text.splitlines())


@pytest.mark.parametrize(
    ("scheduler", "decays", "grouped", "sampling", "bf16"),
    [
        ("linear", True, True, "group_by_length", False),
        ("constant_with_warmup", False, False, "random", True),
    ],
)
def test_sft_follows_the_configured_schedule_and_batching(
    tiny_model_dir, tmp_path, monkeypatch, scheduler, decays, grouped, sampling, bf16
):
    """A real SFT run on the tiny model: the learning rate follows ``sft.lr_scheduler_type``
    and the batches are grouped by length or drawn in random order as
    ``sft.grouped_batches`` says. With ``grpo.bf16: true`` it computes in bfloat16 on the
    CPU too (autocast) and still writes a float32 adapter."""
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.training.sft import build_sft_examples, run_sft
    from conductor_pipeline.training.trainer_args import lora_config
    from conductor_pipeline.workflow import PromptConfig

    from .fakes import make_task

    built: list[dict] = []
    original = trl.SFTConfig

    def recorded_config(*args, **kwargs):
        built.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(trl, "SFTConfig", recorded_config)
    config = TrainingConfig.from_params(
        {
            "base_model": str(tiny_model_dir),
            "seed": 0,
            "sft": {
                "n_examples": 8,
                "max_steps": 6,
                "batch_size": 2,
                "learning_rate": 1e-3,
                "lr_scheduler_type": scheduler,
                "grouped_batches": grouped,
                "max_length": 512,
            },
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "grpo": {"bf16": bf16},
        }
    )
    tasks = [make_task(i, i, 2) for i in range(8)]
    prompt = PromptConfig(question_to_workers=True, few_shot=[])
    examples = build_sft_examples(tasks, ["a", "b"], ["", ""], prompt, config.sft, seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    result = run_sft(
        model,
        tokenizer,
        examples,
        config,
        tmp_path,
        peft_config=lora_config(config, 2),
        show_progress=False,
    )

    assert built and built[0]["train_sampling_strategy"] == sampling
    assert built[0]["bf16"] is bf16
    assert all(math.isfinite(h["loss"]) for h in result.history)
    rates = [h["learning_rate"] for h in result.history]
    assert len(rates) == 6
    after_warmup = rates[2:]
    if decays:
        assert all(a > b for a, b in zip(after_warmup, after_warmup[1:], strict=False))
    else:
        assert after_warmup == [pytest.approx(1e-3)] * len(after_warmup)
    assert (result.adapter_dir / "adapter_config.json").exists()
    from safetensors.torch import load_file

    weights = load_file(result.adapter_dir / "adapter_model.safetensors")
    assert {str(w.dtype) for w in weights.values()} == {"torch.float32"}


def test_sft_rejects_an_unknown_scheduler():
    from conductor_pipeline.training.configs import SFTSettings

    with pytest.raises(ValueError, match="lr_scheduler_type must be one of"):
        SFTSettings(lr_scheduler_type="warmup_then_nothing")
