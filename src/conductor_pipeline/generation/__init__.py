"""The local generation engine: what serving, evaluation, ``conductor ask``, GRPO rollouts and
the sandbox's real worker share to turn a prompt into tokens on this machine.

It sits below ``workflow``, ``workers``, ``serving`` and ``training`` and imports none of
them (``tests/test_imports.py``); it needs torch and transformers only.

``token_draw``: the one way a token is drawn (temperature and top-p as transformers' warpers,
one seeded generator per row, so a row's text depends on its prompt, its seed and the
sampling settings, never on the rows beside it).

``decode``: the one decode loop of served, evaluated and asked replies, of GRPO rollouts
(TRL's ``rollout_func``: ``training/rollouts.py``) and of the sandbox's SmolLM2 worker
(lookup decoding of a batch that rows join and leave; a single request is a batch of one
row, rows repeating a prompt share its prompt pass); ``local``: a loaded model's generation
state (the kept prompt opening, recent replies, one generation at a time); ``chat``:
conversations in, reply texts out, over the engine's continuous batch (the Conductor policy's
and the real worker's); ``batching``: the one micro-batcher, gathering concurrent requests
into continuous batches (the API's and evaluation's), and the one rule by which a batch takes
queued requests (``take_queued``, which the sandbox's real worker follows too).

``attention``: the one attention (transformers' SDPA with grouped key/value heads broadcast by
the kernel, packed rows); ``kv_cache``: cache layers that
passes append into in place.

Private hooks the engine and its callers rely on, checked against torch 2.13.0,
transformers 5.17.0 and TRL 1.16.0 (``tests/generation/test_private_hooks.py`` fails when an
upgrade moves one):

- transformers: ``PretrainedConfig._attn_implementation`` (switched for the duration of a
  rollout), attention functions receiving the model call's extra keyword arguments,
  ``AttentionInterface``/``AttentionMaskInterface.register`` with ``masking_utils.sdpa_mask``,
  the attention module's ``layer_idx``, ``is_causal`` and ``num_key_value_groups``;
  ``cache_utils.DynamicLayer``'s ``keys``, ``values``, ``is_initialized`` and
  ``lazy_initialization``, ``Cache(layers=...)``; the Llama layout (``embed_tokens``,
  ``layers``, ``rotary_emb``, ``norm``, layers called with ``position_embeddings``).
- TRL: ``GRPOTrainer._get_per_token_logps_and_entropies`` (overridden by the trainer's
  grouped scoring), and its ``eos_token_ids``, ``_is_vlm``, ``use_vllm`` and
  ``_entropy_bonus_enabled`` attributes. Rollouts use the public ``rollout_func`` (marked
  experimental in TRL 1.16) and the trainer's ``processing_class``, ``chat_template``,
  ``chat_template_kwargs``, ``temperature``, ``top_p`` and ``max_completion_length``.
- torch: none (``scaled_dot_product_attention(enable_gqa=...)`` is public since 2.5).
"""
