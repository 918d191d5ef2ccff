"""Integration tests: the sandbox server as a real subprocess, reached over HTTP.

One server (with SmolLM2 loaded) serves the whole module; every worker is called through the
official ``openai`` client and through ``litellm``, as the pool will call it.
"""

from __future__ import annotations

import json
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from conductor_pipeline.tasks.types import Task
from conductor_pipeline.workers.sandbox import SandboxServer, SandboxStartError, load_profiles
from conductor_pipeline.workers.sandbox.profiles import default_profiles_path

QUESTION = (
    "A gardener plants 12 rows of 9 tulips and 4 rows of 15 daffodils. How many flowers "
    "does the gardener plant in total?"
)

TASKS = [
    Task(
        id="srv-num",
        domain="math",
        difficulty="easy",
        question=QUESTION,
        answer="168",
        answer_format="number",
        verifier="numeric",
        source="hand",
    ),
    Task(
        id="srv-mc",
        domain="logic",
        difficulty="medium",
        question=(
            "If all bloops are razzies and all razzies are lazzies, which statement must be "
            "true? (A) all lazzies are bloops (B) all bloops are lazzies (C) no bloop is a "
            "lazzie (D) some razzies are not bloops"
        ),
        answer="B",
        answer_format="letter",
        verifier="multiple_choice",
        source="hand",
    ),
]

PROFILES = load_profiles(default_profiles_path())
MESSAGES = [{"role": "user", "content": f"Solve this carefully. {QUESTION}"}]
# small, so that the real worker's share of each test stays short on a busy 2-core machine
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sandbox")
    tasks_file = folder / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_record()) + "\n" for t in TASKS))
    # conf/base's profiles with the real worker in float32, where a reply does not depend on
    # the batch it shared (in bfloat16 a batch's rounding can change it: docs/sandbox.md)
    profiles = yaml.safe_load(default_profiles_path().read_text())
    profiles["real"] = [{**real, "dtype": "float32"} for real in profiles["real"]]
    profiles_path = folder / "sandbox_workers.yml"
    profiles_path.write_text(yaml.safe_dump(profiles))
    started = time.perf_counter()
    server = SandboxServer(
        tasks_paths=[tasks_file], profiles_path=profiles_path, latency_scale=0.0, seed=7
    )
    with server:
        server.startup_s = time.perf_counter() - started
        yield server
    assert not server.running


def test_health_and_models(sandbox):
    assert sandbox.base_url == f"http://127.0.0.1:{sandbox.port}/v1"
    health = httpx.get(f"{sandbox.url}/health", timeout=5)
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["real_model_loaded"] is True
    assert health.json()["real_model_dtype"] == "float32"
    models = httpx.get(f"{sandbox.base_url}/models", timeout=5).json()
    owners = {m["id"]: m["owned_by"] for m in models["data"]}
    assert set(owners) == set(PROFILES.names)
    assert all(owners[p.name] == "sandbox-simulated" for p in PROFILES.simulated)
    assert [e["api_base"] for e in sandbox.pool_config()] == [sandbox.base_url] * len(owners)


def test_every_worker_through_the_openai_client(sandbox):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=sandbox.base_url, api_key="sandbox", max_retries=0)
    for name in PROFILES.names:
        reply = client.chat.completions.create(
            model=name, messages=MESSAGES, temperature=0.3, seed=1, max_tokens=MAX_TOKENS
        )
        text = reply.choices[0].message.content
        assert text and text.strip(), name
        assert reply.model == name
        assert reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= MAX_TOKENS
        assert reply.choices[0].finish_reason in ("stop", "length")


async def test_every_worker_through_litellm(sandbox):
    litellm = pytest.importorskip("litellm")
    for name in PROFILES.names:
        reply = await litellm.acompletion(
            model=f"openai/{name}",
            api_base=sandbox.base_url,
            api_key="sandbox",
            messages=MESSAGES,
            temperature=0.2,
            seed=3,
            max_tokens=MAX_TOKENS,
            num_retries=0,
        )
        assert reply.choices[0].message.content.strip(), name
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_simulated_replies_are_deterministic_over_http(sandbox):
    body = {"model": "sim-sage", "messages": MESSAGES, "seed": 42, "temperature": 0.7}
    first = httpx.post(f"{sandbox.base_url}/chat/completions", json=body, timeout=10).json()
    second = httpx.post(f"{sandbox.base_url}/chat/completions", json=body, timeout=10).json()
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert first["id"] != second["id"]


def test_real_worker_generates_text(sandbox):
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "Name three colours."}],
        "temperature": 0,
        "max_tokens": 24,
    }
    started = time.perf_counter()
    response = httpx.post(f"{sandbox.base_url}/chat/completions", json=body, timeout=120)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200
    data = response.json()
    assert data["choices"][0]["message"]["content"].strip()
    assert 0 < data["usage"]["completion_tokens"] <= 24
    assert elapsed < 90
    again = httpx.post(f"{sandbox.base_url}/chat/completions", json=body, timeout=120).json()
    assert again["choices"][0]["message"]["content"] == data["choices"][0]["message"]["content"]


def test_concurrent_real_requests_share_a_batch_and_keep_their_own_text(sandbox):
    prompts = ["Name three colours.", "Name a fruit.", "What is two plus two?", "Say hello."]

    def body(i: int) -> dict:
        return {
            "model": "smollm2-135m",
            "messages": [{"role": "user", "content": prompts[i]}],
            # a batch's rows share a temperature and a token limit (others wait their turn)
            "temperature": 0.7,
            # not 100 + i: seed 103 draws "Say hello."'s fifth token on a boundary that the
            # float rounding of a padded batch (4e-5 in the logits) crosses on one thread
            "seed": 200 + i,
            "max_tokens": 10,
        }

    def ask(i: int) -> dict:
        response = httpx.post(f"{sandbox.base_url}/chat/completions", json=body(i), timeout=120)
        assert response.status_code == 200, response.text
        return response.json()

    before = httpx.get(f"{sandbox.url}/health", timeout=10).json()["real_model_batches"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, range(len(prompts))))
    health = httpx.get(f"{sandbox.url}/health", timeout=10).json()
    # four requests in flight at once need fewer than four generate calls
    assert health["real_model_batches"] - before < len(prompts)
    assert health["real_model_max_batch"] >= 2
    for i, reply in enumerate(together):
        assert 0 < reply["usage"]["completion_tokens"] <= 10
        alone = ask(i)  # the same request on its own: same seed, same text
        assert (
            alone["choices"][0]["message"]["content"] == reply["choices"][0]["message"]["content"]
        )


def test_errors_over_http(sandbox):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=sandbox.base_url, api_key="sandbox", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-imaginary", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="streaming is not supported"):
        client.chat.completions.create(model="sim-sprout", messages=MESSAGES, stream=True)
    raw = httpx.post(f"{sandbox.base_url}/chat/completions", json={"model": "sim-sage"}, timeout=5)
    assert raw.status_code == 400 and "messages" in raw.json()["error"]["message"]


def test_start_failure_shows_the_server_output(tmp_path: Path):
    bad = tmp_path / "bad.yml"
    bad.write_text("simulated:\n  - name: sim-x\n    colour: blue\n")
    server = SandboxServer(profiles_path=bad, load_real_model=False, startup_timeout_s=60)
    with pytest.raises(SandboxStartError, match="exited with code") as caught:
        server.start()
    assert not server.running
    assert "simulated[0]: unknown key 'colour'" in str(caught.value)


def test_inline_tasks_and_shutdown(tmp_path: Path):
    with SandboxServer(tasks=TASKS, load_real_model=False, latency_scale=0.0) as server:
        url = server.url
        assert httpx.get(f"{url}/health", timeout=5).json()["tasks"] == len(TASKS)
    assert not server.running
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


def test_start_timeout_names_the_status_and_stops_the_server():
    server = SandboxServer(startup_timeout_s=1.5)  # the real model cannot load that fast
    with pytest.raises(SandboxStartError, match=r"not healthy after 2 s \(last status: loading\)"):
        server.start()
    assert not server.running
    assert "no tasks loaded" in server.last_log


def _ask_real_worker(server: SandboxServer) -> httpx.Response:
    body = {"model": "smollm2-135m", "messages": MESSAGES, "max_tokens": 4, "seed": 1}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)


@pytest.mark.slow
def test_a_request_for_the_real_worker_while_its_model_loads_waits_for_it():
    """The pool is handed out before the model has loaded (workers/runtime.py): a call to
    the real worker that comes meanwhile is answered once the model is in memory."""
    server = SandboxServer(tasks=TASKS, latency_scale=0.0)
    try:
        server.start(wait_for_model=False)
        assert httpx.get(f"{server.url}/health", timeout=5).json()["status"] == "loading"
        simulated = {"model": "sim-sage", "messages": MESSAGES}
        sim = httpx.post(f"{server.base_url}/chat/completions", json=simulated, timeout=30)
        assert sim.status_code == 200  # the simulated workers do not wait
        reply = _ask_real_worker(server)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(f"{server.url}/health", timeout=5).json()["status"] == "ok"
        server.wait_until_ready()
    finally:
        server.stop()


def test_a_model_that_cannot_load_fails_the_wait_for_it_and_stops_the_server(tmp_path: Path):
    not_a_folder = tmp_path / "models"
    not_a_folder.write_text("a file where the cache's parent folder should be")
    server = SandboxServer(tasks=TASKS, latency_scale=0.0, model_cache_dir=not_a_folder / "smollm2")
    server.start(wait_for_model=False)  # the simulated workers answer before the model fails
    reported: queue.Queue[str] = queue.Queue()
    server.watch_model_load(reported.put, poll_s=0.1)
    # a request that waited for the load gets its error, not a hang
    reply = _ask_real_worker(server)
    assert reply.status_code == 503
    assert "is unavailable: FileExistsError: " in reply.json()["error"]["message"]
    assert reported.get(timeout=30).startswith("FileExistsError: ")  # a bound for a hang
    with pytest.raises(SandboxStartError, match="failed to load its real model"):
        server.wait_until_ready()
    assert not server.running


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process; an exited one whose new parent has not reaped it
    yet (a zombie) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def test_server_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """The server runs in its own session (Ctrl-C reaches only the parent); a parent killed
    outright must not leave it running. The server's parent watch polls once a second and
    then shuts down gracefully: 30 s is a bound for a hang, not a speed target."""
    import signal
    import subprocess
    import sys
    import textwrap

    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("")
    pid_file = tmp_path / "server.pid"
    parent = textwrap.dedent(
        f"""
        import pathlib, time
        from conductor_pipeline.workers.sandbox import SandboxServer
        server = SandboxServer(tasks_paths=[{str(tasks_file)!r}], load_real_model=False, latency_scale=0.0).start()
        pathlib.Path({str(pid_file)!r}).write_text(str(server._process.pid))
        time.sleep(600)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", parent])
    server_pid = None
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pid_file.exists(), "the parent did not start the sandbox server"
        server_pid = int(pid_file.read_text())
        assert _running(server_pid)
        process.send_signal(signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 30
        while _running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(server_pid), "the sandbox server outlived its killed parent"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if server_pid is not None and _running(server_pid):
            os.kill(server_pid, signal.SIGKILL)


def test_a_server_stopped_while_its_model_loads_reports_no_load_error():
    server = SandboxServer(tasks=TASKS, latency_scale=0.0)
    reported: queue.Queue[str] = queue.Queue()
    server.start(wait_for_model=False)
    server.watch_model_load(reported.put, poll_s=0.05)
    server.stop()
    time.sleep(0.5)  # the watcher's poll sees the server gone and ends quietly
    assert reported.empty()
