"""The vLLM launcher accepts only the server it launched, serving what it asked for, and
stops all of it; the GPU profile's training server and evaluation server use two ports.

Stand-ins: tests/fake_vllm_server.py, run as the `vllm` program (launched by the launcher)
or directly (a server that is not ours).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from conductor_pipeline.project import load_project_config
from conductor_pipeline.serving.policy_server import (
    PolicyServerError,
    VllmPolicyServer,
    VllmSettings,
)
from conductor_pipeline.serving.settings import serving_settings
from conductor_pipeline.serving.vllm_process import port_in_use

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake_vllm_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped holds nothing and counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def adapter(tmp_path) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    return folder


@pytest.fixture
def program(tmp_path) -> tuple[Path, Path]:
    """The `vllm` program: touches a marker when launched, then runs the stand-in."""
    marker = tmp_path / "launched"
    script = tmp_path / "vllm"
    script.write_text(f'#!/bin/sh\ntouch "{marker}"\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    script.chmod(0o755)
    return script, marker


def _settings(program: Path, port: int, **env: str) -> VllmSettings:
    return VllmSettings(
        base_model="smollm2-135m-instruct",
        executable=str(program),
        port=port,
        env=env,
        startup_timeout_s=60,
    )


def _wait_for_health(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "the stand-in server exited"
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the stand-in server at {url} never answered /health")


def test_a_port_another_server_holds_is_refused_before_launching(program, adapter):
    script, marker = program
    port = _free_port()
    other = subprocess.Popen(
        [sys.executable, str(FAKE), "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", str(port)],
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_for_health(f"http://127.0.0.1:{port}", other)
        assert port_in_use("127.0.0.1", port)
        server = VllmPolicyServer(_settings(script, port), adapter)
        with pytest.raises(PolicyServerError) as refused:
            server.start()
    finally:
        other.terminate()
        other.wait(timeout=30)
    message = str(refused.value)
    assert f"127.0.0.1:{port} is already taken" in message
    assert "Qwen/Qwen2.5-7B-Instruct" in message  # what the other server serves
    assert "serving.vllm.port" in message
    assert not marker.exists(), "the launcher started vLLM on a taken port"
    assert not server.running


def test_a_server_that_does_not_list_the_asked_names_is_refused(program, adapter, tmp_path):
    script, marker = program
    settings = _settings(script, _free_port(), FAKE_VLLM_UNLISTED="conductor")
    server = VllmPolicyServer(settings, adapter)
    with pytest.raises(PolicyServerError) as refused:
        server.start()
    message = str(refused.value)
    assert "answers /health but its /v1/models lists ['conductor-base']" in message
    assert "without ['conductor']" in message
    assert marker.exists() and not server.running


def test_the_launcher_accepts_its_own_server_serving_every_asked_name(program, adapter):
    script, _ = program
    modules = {"conductor-v2": adapter}
    server = VllmPolicyServer(_settings(script, _free_port()), adapter, lora_modules=modules)
    with server:
        assert server.served_names == ["conductor", "conductor-base", "conductor-v2"]
        assert server.running
    assert not server.running


def test_stop_ends_the_whole_process_group(program, tmp_path):
    script, _ = program
    pid_file = tmp_path / "grandchild.pid"
    server = VllmPolicyServer(
        _settings(script, _free_port(), FAKE_VLLM_GRANDCHILD_PID=str(pid_file)), None
    )
    server.start()
    grandchild = int(pid_file.read_text())
    try:
        assert _alive(grandchild)
        server.stop()
        assert not _alive(grandchild), "stop() left a process of the server's group running"
    finally:
        if _alive(grandchild):
            os.kill(grandchild, 9)


# -- the GPU profile: TRL's training server and the evaluation server ------------------------


def test_the_trl_training_server_and_the_policy_server_use_different_ports():
    config = load_project_config("gpu", root=REPO)
    grpo = config.parameters["training"]["grpo"]
    url = urlparse(grpo["vllm_server_base_url"])
    vllm = serving_settings(config.parameters["serving"]).vllm
    assert url.hostname == "127.0.0.1" and url.port is not None
    assert url.port != vllm.port, "evaluation would reach TRL's server as its own"


def test_the_documented_recipe_serves_trl_on_the_configured_port_without_a_key():
    page = (REPO / "docs" / "training.md").read_text()  # "Training on GPUs"
    start = page.index("# several GPUs: a vLLM server on GPU 4")
    recipe = page[start : page.index("```", start)]
    url = urlparse(
        load_project_config("gpu", root=REPO).parameters["training"]["grpo"]["vllm_server_base_url"]
    )
    server = next(line for line in recipe.splitlines() if "vllm serve" in line)
    # TRL's client sends no key: with VLLM_API_KEY inherited, vLLM would answer it 401
    assert "env -u VLLM_API_KEY" in server
    ports = re.findall(r"--port (\d+)", recipe)
    assert ports == [str(url.port)]
    # the training command reads the URL from conf/gpu rather than repeating it
    training = recipe[recipe.index("accelerate launch") :]
    assert "vllm_server_base_url" not in training
