"""The precision a local Conductor runs in: ``float32``, ``bfloat16``, or ``auto``, which takes
bfloat16 only where the CPU multiplies it in hardware."""

from __future__ import annotations

import pytest
import torch

from conductor_pipeline.workers import local_model
from conductor_pipeline.workers.local_model import model_dtype, native_bfloat16


def test_named_precisions_and_a_clear_error_for_others():
    assert model_dtype("float32") is torch.float32
    assert model_dtype("bfloat16") is torch.bfloat16
    for bad in ("float16", "fp32", "", None):
        with pytest.raises(ValueError, match="dtype: must be one of"):
            model_dtype(bad)


@pytest.mark.parametrize(("native", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_takes_bfloat16_only_where_the_cpu_has_it(monkeypatch, native, expected):
    monkeypatch.setattr(local_model, "native_bfloat16", lambda: native)
    assert model_dtype("auto") is expected


@pytest.mark.parametrize(
    ("features", "native"),
    [
        ({"amx_bf16": True, "avx512_bf16": False}, True),
        ({"amx_bf16": False, "avx512_bf16": True}, True),
        ({"amx_bf16": False, "avx512_bf16": False, "avx512_f": True}, False),
        ({}, False),
    ],
)
def test_native_bfloat16_reads_torchs_cpu_report(monkeypatch, features, native):
    monkeypatch.setattr(torch._C._cpu, "_get_cpu_capability", lambda: features, raising=False)
    assert native_bfloat16() is native


def test_without_torchs_cpu_report_auto_is_float32(monkeypatch):
    monkeypatch.delattr(torch._C._cpu, "_get_cpu_capability", raising=False)
    assert native_bfloat16() is False
    assert model_dtype("auto") is torch.float32


def test_a_real_sandbox_worker_names_its_precision_and_shares_one_model():
    import yaml

    from conductor_pipeline.workers.sandbox.profiles import (
        ProfileError,
        default_profiles_path,
        parse_profiles,
    )
    from conductor_pipeline.workers.sandbox.real_workers import RealWorkers

    data = yaml.safe_load(default_profiles_path().read_text())
    [real] = data["real"]
    assert real["dtype"] == "auto"  # conf/base: bfloat16 only where the CPU has it
    assert parse_profiles({**data, "real": [{**real, "dtype": "bfloat16"}]}).real[0].dtype == (
        "bfloat16"
    )
    without = {k: v for k, v in real.items() if k != "dtype"}
    assert parse_profiles({**data, "real": [without]}).real[0].dtype == "float32"
    with pytest.raises(ProfileError, match=r"real\[0\]\.dtype: must be one of"):
        parse_profiles({**data, "real": [{**real, "dtype": "half"}]})
    two = parse_profiles(
        {**data, "real": [{**real, "dtype": "float32"}, {**real, "name": "other", "dtype": "auto"}]}
    ).real
    with pytest.raises(ValueError, match="share one model"):
        RealWorkers(two, None, None)


def test_a_real_sandbox_worker_loads_in_its_profiles_precision():
    import dataclasses

    from conductor_pipeline.workers.sandbox.profiles import default_profiles_path, load_profiles
    from conductor_pipeline.workers.sandbox.real_workers import RealWorkers

    [real] = load_profiles(default_profiles_path()).real
    workers = RealWorkers([dataclasses.replace(real, dtype="bfloat16")], None, 1)
    workers.start_loading()
    assert workers.ready.wait(120) and workers.error is None, workers.error
    assert workers.loaded_dtype == "bfloat16"
    assert {p.dtype for p in workers.model.parameters()} == {torch.bfloat16}
