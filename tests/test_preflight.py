"""The preflight: before the first node, a run checks every worker endpoint, key and dataset
it will need, and stops with one message per missing thing (not a traceback on the first,
and not days later when evaluation first loads a gated benchmark). Endpoints are stand-in
OpenAI-compatible servers on 127.0.0.1; datasets load offline, from local files or not at
all."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conductor_pipeline.preflight import (
    PreflightFailed,
    PreflightSettings,
    check_before_run,
    checks_for,
    run_preflight,
)
from conductor_pipeline.workers.probe import check_worker_pool

KEY = "sk-test-value-never-shown"


class _Server(BaseHTTPRequestHandler):
    """``GET /v1/models`` lists ``Qwen/Qwen3-32B`` for the bearer ``KEY`` (401 otherwise);
    ``POST /v1/chat/completions`` answers ``OK`` for that key."""

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {KEY}":
            return True
        self._send(401, {"error": {"message": "invalid api key", "type": "auth"}})
        return False

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            self._send(404, {"error": "not found"})
        elif self._authorised():
            self._send(200, {"object": "list", "data": [{"id": "Qwen/Qwen3-32B"}]})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if not self._authorised():
            return
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": request.get("model"),
                "choices": [
                    {"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "OK"}}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            },
        )  # fmt: skip


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _pool(server: str) -> dict:
    return {
        "kind": "configured",
        "defaults": {"timeout_s": 600, "num_retries": 5},
        "workers": [
            # fine: the endpoint serves the model and takes the key
            {"name": "qwen", "model": "hosted_vllm/Qwen/Qwen3-32B", "api_base": server,
             "api_key_env": "GOOD_KEY"},
            # the endpoint answers, but serves another model
            {"name": "gemma", "model": "hosted_vllm/google/gemma-3-27b-it", "api_base": server,
             "api_key_env": "GOOD_KEY"},
            # the endpoint rejects the key
            {"name": "qwen-wrong-key", "model": "hosted_vllm/Qwen/Qwen3-32B",
             "api_base": server, "api_key_env": "WRONG_KEY"},
            # nothing listens there; two workers on it are one problem
            {"name": "r1", "model": "hosted_vllm/deepseek-ai/R1", "api_base": _closed_port_url(),
             "api_key_env": "GOOD_KEY", "fallbacks": ["qwen"]},
            # hosted providers without their keys; one shared variable is one problem
            {"name": "gpt-5", "model": "openai/gpt-5", "api_key_env": "MISSING_OPENAI_KEY"},
            {"name": "gpt-5-mini", "model": "openai/gpt-5-mini",
             "api_key_env": "MISSING_OPENAI_KEY"},
            {"name": "claude", "model": "anthropic/claude-sonnet-4",
             "credentials_key": "anthropic"},
        ],
    }  # fmt: skip


ENV = {"GOOD_KEY": KEY, "WRONG_KEY": "sk-wrong-value-never-shown"}


def test_every_worker_problem_is_reported_once_and_no_key_is_shown(server):
    problems = check_worker_pool(_pool(server), {}, environ=ENV, timeout_s=5)
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert KEY not in text and ENV["WRONG_KEY"] not in text
    by_worker = {p.split(":", 1)[0]: p for p in problems}
    assert "does not serve 'google/gemma-3-27b-it'" in by_worker["worker gemma"]
    assert "rejects the key" in by_worker["worker qwen-wrong-key"]
    assert "WRONG_KEY" in by_worker["worker qwen-wrong-key"]
    assert "does not answer" in by_worker["worker r1"]
    assert "MISSING_OPENAI_KEY is not set" in by_worker["workers gpt-5, gpt-5-mini"]
    # the fixes name the page that shows how to configure a provider
    assert "docs/sandbox.md, 'Adding a real provider'" in by_worker["worker r1"]
    assert "docs/sandbox.md, 'Adding a real provider'" in by_worker["workers gpt-5, gpt-5-mini"]
    assert "'anthropic' is not in" in by_worker["worker claude"]
    assert not any(p.startswith("worker qwen:") for p in problems)


def test_a_hosted_worker_gets_one_short_request_when_asked(server, monkeypatch):
    # litellm sends openai/* requests to OPENAI_BASE_URL: the stand-in plays the provider
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    pool = {
        "kind": "configured",
        "workers": [
            {"name": "gpt-ok", "model": "openai/gpt-5", "api_key_env": "GOOD_KEY"},
            {"name": "gpt-refused", "model": "openai/gpt-5", "api_key_env": "WRONG_KEY"},
        ],
    }
    assert check_worker_pool(pool, {}, environ=ENV, timeout_s=5) == []  # keys only
    problems = check_worker_pool(pool, {}, environ=ENV, timeout_s=5, hosted_completion=True)
    assert len(problems) == 1 and problems[0].startswith("worker gpt-refused: ")
    assert "refused a one-line request" in problems[0]
    assert ENV["WRONG_KEY"] not in problems[0]


def test_a_sandbox_pool_needs_no_probe():
    assert check_worker_pool({"kind": "sandbox", "sandbox": {}}, {}) == []


def _params(tmp_path) -> dict:
    good = tmp_path / "math500.jsonl"
    good.write_text(json.dumps({"problem": "What is 2 + 2?", "answer": "4"}) + "\n")
    return {
        "data_prep": {"seed": 42, "sources": {"math500": {"data_files": str(good)}}},
        "evaluation": {
            "seed": 0,
            "benchmarks": {
                "math500": {"data_files": str(good), "limit": 1},
                # the gated benchmark, offline and not in the cache: fails now, not days later
                "gpqa_diamond": {},
                "aime25": {"data_files": str(tmp_path / "missing.jsonl")},
            },
        },
    }


def test_every_dataset_the_run_needs_is_loaded_and_each_failure_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = PreflightSettings(enabled=True)
    problems = run_preflight(settings, {"data_prep", "benchmarks"}, _params(tmp_path), None, None)
    assert [p.split(":", 1)[0] for p in problems] == [
        "evaluation.benchmarks.gpqa_diamond",
        "evaluation.benchmarks.aime25",
    ]
    assert "Idavidrein/gpqa" in problems[0] and "hf auth login" in problems[0]
    # the data_prep sources only when data_prep runs
    assert run_preflight(settings, {"data_prep"}, _params(tmp_path), None, None) == []


def test_which_checks_a_pipeline_needs():
    from conductor_pipeline.pipeline_registry import register_pipelines

    pipelines = register_pipelines()
    # training is checked for the evaluation that follows it days later
    assert checks_for(pipelines["training"].all_inputs()) == {"workers", "benchmarks"}
    assert checks_for(pipelines["__default__"].all_inputs()) == {
        "workers",
        "data_prep",
        "benchmarks",
    }
    assert checks_for(pipelines["promotion"].all_inputs()) == set()


def _catalog(tmp_path, server, enabled=True):
    from kedro.io import DataCatalog, MemoryDataset

    params = _params(tmp_path)
    entries = {
        "params:preflight": {"enabled": enabled, "timeout_s": 5},
        "params:data_prep": params["data_prep"],
        "params:evaluation": params["evaluation"],
        "worker_pool_config": _pool(server),
        "worker_credentials": {},
    }
    catalog = DataCatalog()
    for name, value in entries.items():
        catalog[name] = MemoryDataset(value)
    return catalog


def test_kedro_run_stops_before_its_first_node_with_one_line_per_problem(
    tmp_path, server, monkeypatch
):
    from conductor_pipeline.hooks import ProjectHooks
    from conductor_pipeline.pipeline_registry import register_pipelines

    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MISSING_OPENAI_KEY", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    training = register_pipelines()["training"]
    with pytest.raises(SystemExit) as stopped:
        ProjectHooks().before_pipeline_run({}, training, _catalog(tmp_path, server))
    message = str(stopped.value)
    assert message.startswith("\nCannot run: the preflight checks found 7 problem(s)")
    lines = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(lines) == 7  # 5 worker problems, 2 benchmarks
    assert "gpqa_diamond" in message and "Traceback" not in message
    assert KEY not in message

    # preflight.enabled: false (the sandbox): nothing is checked
    ProjectHooks().before_pipeline_run({}, training, _catalog(tmp_path, server, enabled=False))


def test_check_before_run_reads_only_what_it_needs():
    read_names: list[str] = []

    def read(name):
        read_names.append(name)
        return {"enabled": True} if name == "params:preflight" else None

    check_before_run({"params:promotion"}, read)  # a pipeline that needs no check
    assert read_names == ["params:preflight"]
    with pytest.raises(PreflightFailed, match="no workers.yml"):
        check_before_run({"worker_pool_config"}, read)


def test_the_gpu_profile_runs_the_preflight_and_the_sandbox_does_not():
    from conductor_pipeline.project import load_project_config

    gpu = PreflightSettings.from_params(load_project_config("gpu").parameters["preflight"])
    sandbox = PreflightSettings.from_params(load_project_config().parameters["preflight"])
    assert gpu.enabled and not sandbox.enabled
    with pytest.raises(
        ValueError, match=r"preflight: unknown key 'enable' \(did you mean 'enabled'\?\)"
    ):
        PreflightSettings.from_params({"enable": True})


def test_conductor_preflight_runs_the_checks_alone(capsys):
    from conductor_pipeline.cli import main

    # the sandbox profile: its pool is local and its sources are generated, so all pass
    assert main(["preflight", "--checks", "workers"]) == 0
    assert "0 problem(s)" in capsys.readouterr().out
