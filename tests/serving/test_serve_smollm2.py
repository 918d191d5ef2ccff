"""End to end with a real model: ``conductor serve`` with the untrained SmolLM2-135M
LocalPolicy (in process, transformers on the CPU) over the sandbox."""

from __future__ import annotations

import openai
import pytest

from conductor_pipeline.workers.local_model import native_bfloat16

from .conftest import QUESTION, ServeProcess, make_project, serve_env


@pytest.mark.slow
def test_real_smollm2_conductor_behind_the_api(tmp_path):
    project = make_project(
        tmp_path / "project",
        policy={"kind": "local", "model_dir": None, "adapter": None},
        conductor={
            "max_parse_attempts": 1,
            "sampling": {"temperature": 0.7, "max_tokens": 48, "seed": 0},
        },
    )
    process = ServeProcess(project, [], serve_env(tmp_path)).start(timeout_s=300)
    try:
        client = openai.OpenAI(
            base_url=process.base_url, api_key="unused", max_retries=0, timeout=300
        )
        try:
            response = client.chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": QUESTION}]
            )
            record = response.model_extra["conductor"]
            assert not record["format_failure"] and record["steps"]
        except openai.InternalServerError as err:  # 502: the untrained model wrote no workflow
            assert err.status_code == 502
            record = (
                err.body["conductor"]
                if "conductor" in (err.body or {})
                else err.response.json()["conductor"]
            )
            assert record["format_failure"]
        assert record["model"]["policy"] == "local:smollm2-135m-instruct"
        assert record["model"]["version"] == "base"
        (call,) = record["conductor_calls"]
        assert call["completion_tokens"] > 0 and call["latency_s"] > 0
        # serving.dtype auto: bfloat16 only where this CPU multiplies it in hardware; the
        # log says which precision the server runs (evaluation measured float32)
        precision = "bfloat16" if native_bfloat16() else "float32"
        assert f"Conductor policy local:smollm2-135m-instruct ready ({precision})" in process.output
    finally:
        assert process.stop() == 0
