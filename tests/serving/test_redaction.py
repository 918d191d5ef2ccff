"""Credential masking for the capture and feedback stores: known values (configured or from
the environment) even split by a line break, common key shapes, random-looking tokens; and
ordinary questions, answers and identifiers left as they are."""

from __future__ import annotations

import random
import string

import pytest

from conductor_pipeline.serving.redaction import (
    MASK,
    SecretMasker,
    environment_secrets,
    looks_random,
)

CONFIGURED = "sk-configured-key-0123456789"
UNUSED = "env-planted-Zq81Wm0r"  # in no worker's settings, only in the environment


def masker() -> SecretMasker:
    environ = {"OPENAI_API_KEY": UNUSED, "TOKENIZERS_PARALLELISM": "false", "HOME": "/root"}
    return SecretMasker([CONFIGURED], environ=environ)


def test_only_secret_looking_environment_names_count():
    found = environment_secrets(
        {
            "OPENAI_API_KEY": UNUSED,
            "HF_TOKEN": "hf-token-value-1",
            "DB_PASSWORD": "pa55word-long",
            "TOKENIZERS_PARALLELISM": "false",  # too short to be a key
            "AUTH_MODE": "disabled",  # a word: masking it would mask the word everywhere
            "PATH": "/usr/local/bin:/usr/bin",
        }
    )
    assert sorted(found) == sorted([UNUSED, "hf-token-value-1", "pa55word-long"])


@pytest.mark.parametrize(
    "text",
    [
        f"my key is {CONFIGURED} thanks",
        "my key is sk-configured-\nkey-0123456789 thanks",
        "my key is sk-configured-key-\n    0123456789 thanks",
        f"the server has {UNUSED} set",
        "the server has env-planted-\nZq81Wm0r set",
    ],
)
def test_known_values_are_masked_even_across_line_breaks(text):
    masked = masker().mask(text)
    assert MASK in masked and masked.endswith((" thanks", " set"))
    assert "0123456789" not in masked and "Zq81Wm0r" not in masked


@pytest.mark.parametrize(
    "key",
    [
        "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12",
        "sk-ant-api03-abcdefghijklmnopqrstuv",
        "ghp_0123456789abcdefghijABCDEFGHIJ",
        "github_pat_11ABCDEFG0123456789_abcdefghij",
        "xoxb-1234567890-abcdefghij",
        "AKIAIOSFODNN7EXAMPLE",
        "AIzaSyA1234567890abcdefghijklmnopqrstu",
        "hf_abcdefghijklmnopqrstuvwxyzABCD",
        "glpat-abcdefghij0123456789",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    ],
)
def test_common_key_shapes_are_masked(key):
    masked = SecretMasker(environ={}).mask(f"use {key} please")
    assert masked == f"use {MASK} please"


@pytest.mark.parametrize(
    "text, kept",
    [
        ("Authorization: Bearer abc.def-ghi_jklmnop", "Authorization: "),
        ("api_key = 'hunter2hunter2'", "api_key = '"),
        ("password: s3cretpass", "password: "),
    ],
)
def test_bearer_tokens_and_assignments_are_masked(text, kept):
    masked = SecretMasker(environ={}).mask(text)
    assert masked.startswith(kept + MASK) and "hunter2" not in masked


def test_a_random_token_is_masked_also_split_by_a_line_break():
    token = "Lz8E7r_InE1Jj5kHm6hy9joZOk2ecGxy"
    plain = SecretMasker(environ={})
    assert plain.mask(f"key {token} end") == f"key {MASK} end"
    assert plain.mask(f"key {token[:14]}\n{token[14:]} end") == f"key {MASK} end"


def test_random_tokens_are_found_and_names_are_not():
    generator = random.Random(28)  # fixed: the same 200 keys of each kind every run
    base64url = string.ascii_letters + string.digits + "-_"
    keys = ["".join(generator.choices(base64url, k=43)) for _ in range(200)]
    hex_keys = ["".join(generator.choices("0123456789abcdef", k=40)) for _ in range(200)]
    assert sum(map(looks_random, keys)) >= 190 and sum(map(looks_random, hex_keys)) >= 190
    for name in [
        "SmolLM2-135M-Instruct",
        "Qwen2-VL-7B-Instruct-AWQ",
        "Pneumonoultramicroscopic1",
        "ThisIsAVeryLongCamelCaseIdentifier",
        "12345678901234567890123456789012",
        "2x+3y+4z+5w+6v+7u+8t+9s",
    ]:
        assert not looks_random(name), name


@pytest.mark.parametrize(
    "text",
    [
        "Calculate -5 + -5.",
        "What is \\frac{1}{2} + 10^{10^{10}}?",
        "Use Qwen2-VL-7B-Instruct with SmolLM2-135M-Instruct for the max tokens: 100 case.",
        "The token: transformer; the secret = courage.",
        "The answer is 1234567890123456789012345",
        "def f(x):\n    return x * 2\n",
        "Skip the desk-top and ask-questions-here-please notes.",
    ],
)
def test_ordinary_text_is_left_as_it_is(text):
    assert masker().mask(text) == text


def test_identifier_fields_keep_their_tokens_and_lose_known_values():
    request_id = "chatcmpl-" + "8f3a9c2e71b64d05a9e3c7f1"
    data = {
        "request_id": request_id,
        "time": "2026-01-01T00:00:00.000000Z",
        "model": {"id": f"conductor/{CONFIGURED}"},
        "question": f"id {request_id}",
        "steps": [{"worker_name": "alpha", "subtask": f"use {UNUSED}"}],
    }
    masked = masker().mask_data(data)
    assert masked["request_id"] == request_id and masked["time"] == data["time"]
    assert masked["model"] == {"id": f"conductor/{MASK}"}
    assert masked["question"] == f"id {MASK}"
    assert masked["steps"] == [{"worker_name": "alpha", "subtask": f"use {MASK}"}]
