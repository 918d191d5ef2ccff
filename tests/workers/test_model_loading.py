"""Loading a local model prints nothing: no bar while the weights are read, and no warning
about a space clean-up transformers skips for SmolLM2's BPE tokenizer."""

from __future__ import annotations

import threading

from transformers.utils import logging as transformers_logging

from conductor_pipeline.workers import local_model
from conductor_pipeline.workers.local_model import (
    load_pretrained,
    load_pretrained_tokenizer,
    load_smollm2,
)


def test_loading_smollm2_draws_no_bar_and_decoding_warns_nothing(capfd):
    transformers_logging.enable_progress_bar()  # as in a fresh process
    model, tokenizer = load_smollm2()
    ids = tokenizer("Is 7 prime? Yes , it is .")["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    out, err = capfd.readouterr()
    assert "Loading weights" not in err + out
    assert "clean_up_tokenization_spaces" not in err + out
    assert tokenizer.clean_up_tokenization_spaces is False  # SmolLM2's configuration says True
    # the clean-up transformers skipped is off, so the text is what it was
    assert text == "Is 7 prime? Yes , it is ."
    assert tokenizer.pad_token_id is not None and not model.training
    assert transformers_logging.is_progress_bar_enabled()  # the switch as it was


def test_loads_on_two_threads_leave_the_bars_as_they_were(tiny_model_dir, capfd):
    transformers_logging.enable_progress_bar()
    loaded: list[object] = []
    threads = [
        threading.Thread(target=lambda: loaded.append(load_pretrained(tiny_model_dir)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loaded) == 2 and "Loading weights" not in capfd.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()
    previous = transformers_logging.set_tqdm_hook(None)
    assert previous is None  # the loads' hook is gone again: later bars draw
    transformers_logging.disable_progress_bar()
    load_pretrained(tiny_model_dir)
    assert not transformers_logging.is_progress_bar_enabled()  # a user's choice is kept
    transformers_logging.enable_progress_bar()


def test_a_tokenizer_without_a_pad_token_pads_with_its_end_token(tiny_model_dir, tmp_path):
    saved = load_pretrained_tokenizer(tiny_model_dir)
    saved.pad_token = None
    saved.clean_up_tokenization_spaces = True  # what SmolLM2's own configuration says
    saved.save_pretrained(tmp_path)
    tokenizer = load_pretrained_tokenizer(tmp_path)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id is not None
    assert tokenizer.clean_up_tokenization_spaces is False


def test_the_hubs_download_bars_stay_on_while_a_model_loads(monkeypatch, tmp_path):
    """A base model fetched from the hub (the GPU profile's, online) shows its download:
    only transformers' own bars are hidden while a model loads."""
    import huggingface_hub.utils
    from transformers import AutoModelForCausalLM

    seen: list[bool] = []

    def fetch(source, **kwargs):
        seen.append(huggingface_hub.utils.are_progress_bars_disabled())
        seen.append(transformers_logging.tqdm(range(3), desc="Loading weights").disable)
        return object()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fetch)
    monkeypatch.setattr(local_model, "load_pretrained_tokenizer", lambda source: object())
    local_model.load_pretrained("org/some-base")
    assert seen == [False, True]
