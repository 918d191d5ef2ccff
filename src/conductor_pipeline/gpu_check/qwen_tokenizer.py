"""A Qwen2.5 tokenizer folder made offline, for ``--random-init`` runs of the GPU check on a
machine without the model's files: TRL needs a tokenizer of the model's vocabulary.

Qwen2.5 shares its 151,643 byte-level BPE tokens with Qwen's ``qwen.tiktoken`` file (which
the ``dashscope`` package on PyPI ships); the 22 special tokens above them and the ChatML
template are Qwen2.5's. ``make gpu-tokenizer`` fetches the file and runs this module."""

from __future__ import annotations

import argparse
from pathlib import Path

# Qwen2.5's special tokens, ids 151643.. in this order
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
# Qwen2's pre-tokenizer: digits one at a time (transformers' default groups up to three)
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_qwen_tokenizer(tiktoken_file: Path, out_dir: Path) -> int:
    """Write a transformers tokenizer folder from ``tiktoken_file``; returns its size."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(
        vocab_file=str(tiktoken_file), pattern=PATTERN, extra_special_tokens=list(SPECIAL_TOKENS)
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converter.converted(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return len(tokenizer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiktoken_file", type=Path)
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    size = build_qwen_tokenizer(args.tiktoken_file, args.out_dir)
    print(f"gpu-tokenizer: {size} tokens in {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
