"""The vLLM policy server launcher: its command line (no vLLM needed), the clear failure when
vLLM is missing, and the launch/health/stop cycle against a stand-in program."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from conductor_pipeline.serving.policy_server import (
    PolicyServerError,
    VllmPolicyServer,
    VllmSettings,
    build_vllm_command,
    ensure_vllm_available,
    lora_rank_flag,
    vllm_environment,
)


@pytest.fixture
def adapter(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    return folder


def test_command_serves_the_adapter_by_name(adapter):
    settings = VllmSettings(base_model="Qwen/Qwen2.5-7B-Instruct", executable="vllm", port=8123)
    argv = build_vllm_command(settings, adapter)
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    assert argv[argv.index("--lora-modules") + 1] == f"conductor={adapter}"
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "16"
    assert argv[argv.index("--served-model-name") + 1] == "conductor-base"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--max-model-len") + 1] == "8192"


def test_without_adapter_the_base_model_takes_the_conductor_name():
    argv = build_vllm_command(VllmSettings(executable="vllm"), None)
    assert "--enable-lora" not in argv and "--lora-modules" not in argv
    assert argv[argv.index("--served-model-name") + 1] == "conductor"


def test_lora_rank_covers_the_adapter(tmp_path, adapter):
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 48}))
    argv = build_vllm_command(VllmSettings(executable="vllm", max_lora_rank=16), adapter)
    assert argv[argv.index("--max-lora-rank") + 1] == "64"
    assert lora_rank_flag(8, None) == 8 and lora_rank_flag(17, 4) == 32
    with pytest.raises(ValueError, match="largest"):
        lora_rank_flag(1024, None)


def test_module_launcher_for_a_separate_environment(adapter):
    settings = VllmSettings(
        launcher="module",
        python="/opt/vllm-cpu/bin/python",
        base_model="/models/smollm2",
        extra_args=["--enforce-eager"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        gpu_memory_utilization=None,
        dtype="bfloat16",
    )
    argv = build_vllm_command(settings, adapter)
    assert argv[:5] == [
        "/opt/vllm-cpu/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/smollm2",
    ]
    assert argv[-1] == "--enforce-eager" and "--gpu-memory-utilization" not in argv
    assert vllm_environment(settings, {})["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_the_key_goes_through_the_environment_never_argv(monkeypatch, adapter):
    monkeypatch.setenv("CONDUCTOR_POLICY_API_KEY", "sk-policy-secret-42")
    settings = VllmSettings(executable="vllm")
    assert "sk-policy-secret-42" not in " ".join(build_vllm_command(settings, adapter))
    assert vllm_environment(settings, {})["VLLM_API_KEY"] == "sk-policy-secret-42"
    monkeypatch.delenv("CONDUCTOR_POLICY_API_KEY")
    assert "VLLM_API_KEY" not in vllm_environment(settings, {"VLLM_API_KEY": "unrelated"})
    with pytest.raises(ValueError, match="api_key_env"):
        VllmSettings(extra_args=["--api-key", "x"])


def test_settings_are_validated():
    with pytest.raises(ValueError, match="serving.vllm: unknown key 'gpu'"):
        VllmSettings.from_mapping({"gpu": 1})
    with pytest.raises(ValueError, match="launcher"):
        VllmSettings(launcher="docker")
    with pytest.raises(ValueError, match="lora_name"):
        VllmSettings(lora_name="a=b")


def test_missing_vllm_fails_with_what_to_do(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(PolicyServerError, match="gpu extra.*--policy-server local") as missing:
        ensure_vllm_available(VllmSettings())
    assert "docs/serving.md, 'The GPU policy server'" in str(missing.value)
    with pytest.raises(PolicyServerError, match="not importable"):
        ensure_vllm_available(VllmSettings(launcher="module"))
    with pytest.raises(PolicyServerError, match="not found"):
        ensure_vllm_available(VllmSettings(executable="/nonexistent/vllm"))
    with pytest.raises(PolicyServerError, match="cannot run serving.vllm.python"):
        ensure_vllm_available(VllmSettings(launcher="module", python=sys.executable + "-other"))
    with pytest.raises(PolicyServerError, match="not importable in /bin/sh"):
        ensure_vllm_available(VllmSettings(launcher="module", python="/bin/sh"))


FAKE_VLLM = textwrap.dedent(
    """\
    #!{python}
    # stands in for `vllm serve`: records its argv and environment, answers /health and
    # lists the base model's served name and the LoRA modules' in /v1/models
    import http.server, json, os, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    names = [sys.argv[sys.argv.index("--served-model-name") + 1]]
    if "--lora-modules" in sys.argv:
        names += [sys.argv[sys.argv.index("--lora-modules") + 1].partition("=")[0]]
    with open(os.environ["FAKE_VLLM_RECORD"], "w") as f:
        json.dump({{"argv": sys.argv[1:], "key": os.environ.get("VLLM_API_KEY")}}, f)
    models = json.dumps({{"data": [{{"id": n}} for n in names]}}).encode()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
            self.wfile.write(models if self.path == "/v1/models" else b"{{}}")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def test_launch_waits_for_health_and_stops(tmp_path, monkeypatch, adapter):
    import socket

    program = tmp_path / "vllm"
    program.write_text(FAKE_VLLM.format(python=sys.executable))
    program.chmod(0o755)
    record = tmp_path / "record.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("CONDUCTOR_POLICY_API_KEY", "sk-policy-7")
    settings = VllmSettings(
        executable=str(program),
        port=port,
        env={"FAKE_VLLM_RECORD": str(record)},
        startup_timeout_s=60,
    )
    with VllmPolicyServer(settings, adapter) as server:
        assert server.running
        policy = server.policy()
        assert policy.model == "hosted_vllm/conductor"
        assert policy.api_base == f"http://127.0.0.1:{port}/v1"
        seen = json.loads(record.read_text())
    assert not server.running
    assert seen["argv"][:2] == ["serve", settings.base_model]
    assert seen["key"] == "sk-policy-7"


def test_a_policy_server_that_dies_is_reported_with_its_log(tmp_path):
    program = tmp_path / "vllm"
    program.write_text(f"#!{sys.executable}\nimport sys\nprint('CUDA not found'); sys.exit(3)\n")
    program.chmod(0o755)
    settings = VllmSettings(executable=str(program), port=1, startup_timeout_s=30)
    with pytest.raises(PolicyServerError, match="(?s)exited with code 3.*CUDA not found"):
        VllmPolicyServer(settings, None).start()


def test_several_adapters_are_served_by_name_next_to_the_base(tmp_path, adapter):
    other = tmp_path / "other"
    other.mkdir()
    (other / "adapter_config.json").write_text(json.dumps({"r": 32}))
    settings = VllmSettings(executable="vllm")
    modules = {"conductor-v2": adapter, "conductor-v1": other}
    argv = build_vllm_command(settings, None, modules)
    at = argv.index("--lora-modules")
    # vLLM takes every NAME=PATH after one --lora-modules flag
    assert argv[at + 1 : at + 3] == [f"conductor-v2={adapter}", f"conductor-v1={other}"]
    assert argv[at + 3] == "--max-lora-rank" and argv[at + 4] == "32"
    assert argv[argv.index("--max-loras") + 1] == "2"
    assert argv[argv.index("--served-model-name") + 1] == "conductor-base"

    server = VllmPolicyServer(settings, None, lora_modules=modules)
    assert server.base_name == "conductor-base"
    assert server.endpoint("conductor-v1").model == "hosted_vllm/conductor-v1"
    assert server.endpoint("conductor-base").model == "hosted_vllm/conductor-base"
    with pytest.raises(ValueError, match="not 'conductor'"):
        server.endpoint("conductor")
    # with no adapter at all the base model is what `lora_name` asks for
    assert VllmPolicyServer(settings, None).base_name == "conductor"


def test_a_lora_name_may_not_be_taken_twice(adapter):
    settings = VllmSettings(executable="vllm")
    with pytest.raises(ValueError, match="used twice"):
        build_vllm_command(settings, adapter, {"conductor": adapter})
    with pytest.raises(ValueError, match="used twice"):
        build_vllm_command(settings, None, {"conductor-base": adapter})
    with pytest.raises(ValueError, match="usable"):
        build_vllm_command(settings, None, {"a=b": adapter})
