"""``POST /v1/feedback`` and capture in the chat handler: over the real API in process (fake
pool) for the rules, and over ``conductor serve`` on the sandbox for the privacy defaults:
capture off writes no question anywhere under ``data/`` and refuses feedback; capture on
never stores a key, configured or only in the environment."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from conductor_pipeline.serving.capture import CaptureSettings, FeedbackSettings
from conductor_pipeline.serving.server import BackgroundServer
from conductor_pipeline.tasks.sources.traffic import load_traffic
from tests.serving.conftest import QUESTION, ServeProcess, make_project, serve_env
from tests.serving.test_app import KEY, ask, make_service, post

PLANTED = "sk-planted-feedback-4b8e2d71c9"


def files_text(folder: Path) -> str:
    """Every file under ``folder`` as text (binary files too: SQLite pages hold text)."""
    return "\n".join(
        path.read_bytes().decode("utf-8", errors="replace")
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    )


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def send_feedback(base_url: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{base_url}/feedback", json=body, headers=headers, timeout=30)


@pytest.fixture
def capturing(tmp_path):
    service = make_service(capture=CaptureSettings(enabled=True, path="traffic"))
    service.root = tmp_path
    with BackgroundServer(service) as running:
        running.wait_ready()
        yield running, tmp_path / "traffic"


def test_an_answered_request_is_captured_and_feedback_joins_it(capturing):
    server, folder = capturing
    reply = post(server, ask("What is 6 times 7?"))
    assert reply.status_code == 200, reply.text
    request_id = reply.json()["id"]
    [line] = (folder / "requests.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["request_id"] == request_id and record["question"] == "What is 6 times 7?"
    assert record["answer"] == reply.json()["choices"][0]["message"]["content"]
    assert record["model"]["id"] == "conductor/7" and record["steps"]

    given = send_feedback(server.base_url, {"request_id": request_id, "reference_answer": "42"})
    assert given.status_code == 200, given.text
    assert given.json() == {
        "object": "feedback",
        "request_id": request_id,
        "received": given.json()["received"],
        "kind": "reference_answer",
        "duplicate": False,
        "joinable": True,
    }
    again = send_feedback(server.base_url, {"request_id": request_id, "reference_answer": "42"})
    assert again.status_code == 200 and again.json()["duplicate"] is True
    other = send_feedback(server.base_url, {"request_id": request_id, "verdict": "wrong"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "feedback_conflict"
    [stored] = [json.loads(x) for x in (folder / "feedback.jsonl").read_text().splitlines()]
    assert stored["reference_answer"] == "42" and stored["verifier"] == "numeric"


def test_a_streamed_answer_is_captured_before_it_is_sent(capturing):
    server, folder = capturing
    with httpx.stream(
        "POST",
        f"{server.base_url}/chat/completions",
        json=ask("What is 5 times 5?", stream=True),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: {")]
    request_id = json.loads(events[0][6:])["id"]
    record = json.loads((folder / "requests.jsonl").read_text().splitlines()[-1])
    assert record["request_id"] == request_id and record["question"] == "What is 5 times 5?"
    verdict = send_feedback(server.base_url, {"request_id": request_id, "verdict": "right"})
    assert verdict.status_code == 200 and verdict.json()["kind"] == "verdict"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"request_id": "chatcmpl-nope", "verdict": "right"}, 404, "request_id"),
        ({"request_id": "x", "verdict": "maybe"}, 400, "verdict"),
        ({"request_id": "x", "score": "0.5"}, 400, "score"),
        ({"request_id": "x", "verdict": "right", "score": 1}, 400, None),
        ({"request_id": "x", "verdict": "right", "api_key": "k"}, 400, "api_key"),
        (["not", "an", "object"], 400, None),
    ],
)
def test_bad_feedback_gets_a_clear_4xx(capturing, body, status, param):
    server, folder = capturing
    response = send_feedback(server.base_url, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["param"] == param
    assert not (folder / "feedback.jsonl").exists()


def test_feedback_is_authorized_like_v1_and_the_body_is_capped(tmp_path):
    service = make_service(capture=CaptureSettings(enabled=True, path="t"), max_body_bytes=2048)
    service.root = tmp_path
    with BackgroundServer(service) as server:
        server.wait_ready()
        body = {"request_id": "x", "verdict": "right"}
        assert send_feedback(server.base_url, body, key=None).status_code == 401
        assert send_feedback(server.base_url, body, key="sk-wrong-key-123").status_code == 401
        big = {"request_id": "x", "reference_answer": "9" * 4096}
        assert send_feedback(server.base_url, big).status_code == 413
    assert not (tmp_path / "t" / "feedback.jsonl").exists()


def test_ready_and_models_state_whether_capture_is_on(tmp_path):
    off = make_service()
    off.root = tmp_path
    with BackgroundServer(off) as server:
        server.wait_ready()
        ready = httpx.get(f"{server.url}/ready", timeout=10).json()
        models = httpx.get(
            f"{server.base_url}/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
        ).json()
    assert ready["capture"]["enabled"] is False and ready["capture"]["stores"] == []
    assert all(entry["capture"]["enabled"] is False for entry in models["data"])
    assert not any(tmp_path.iterdir()), "capture off: the server created nothing"

    on = make_service(capture=CaptureSettings(enabled=True, path="kept", max_age_days=7))
    on.root = tmp_path
    with BackgroundServer(on) as server:
        server.wait_ready()
        ready = httpx.get(f"{server.url}/ready", timeout=10).json()
    assert ready["capture"]["enabled"] is True and "question" in ready["capture"]["stores"]
    assert ready["capture"]["retention"]["max_age_days"] == 7


def test_a_capture_failure_never_fails_the_answer(capturing, caplog):
    server, folder = capturing
    (folder / "requests.jsonl").mkdir()  # appending to a folder fails
    reply = post(server, ask("What is 3 times 3?"))
    assert reply.status_code == 200, reply.text
    assert "not captured" in caplog.text


def test_with_capture_off_feedback_is_refused_and_nothing_is_written(tmp_path):
    """Before, any id was accepted (``"joinable": false``) and every post grew the file."""
    service = make_service()
    service.root = tmp_path
    with BackgroundServer(service) as server:
        server.wait_ready()
        for number in range(5):
            body = {"request_id": f"r{number}", "verdict": "wrong", "comment": "x" * 2000}
            response = send_feedback(server.base_url, body)
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "capture_off"
    assert not any(tmp_path.iterdir()), "capture off: feedback wrote nothing"


def test_feedback_files_rotate_and_stay_within_their_caps(tmp_path):
    limits = FeedbackSettings(max_file_bytes=4096, keep_files=1, max_records=4)
    service = make_service(capture=CaptureSettings(enabled=True, path="t", feedback=limits))
    service.root = tmp_path
    with BackgroundServer(service) as server:
        server.wait_ready()
        for number in range(12):
            request_id = post(server, ask(f"What is {number} times 7?")).json()["id"]
            body = {"request_id": request_id, "verdict": "wrong", "comment": "y" * 1500}
            assert send_feedback(server.base_url, body).status_code == 200
    files = sorted((tmp_path / "t").glob("feedback*.jsonl"))
    assert [p.name for p in files] == ["feedback.1.jsonl", "feedback.jsonl"]
    assert sum(p.stat().st_size for p in files) <= 2 * 4096


def test_credentials_nobody_configured_reach_no_capture_feedback_or_task(tmp_path, monkeypatch):
    """Before, a key only in the server's environment (no worker uses it), pasted into a
    question and a comment, was stored verbatim and became part of a training task; so was
    the server's own key split by a line break."""
    unused = "sk-proj-Unused8Key2In4The6Env0ironment"
    monkeypatch.setenv("OPENAI_API_KEY", unused)
    monkeypatch.setenv("VENDOR_TOKEN", "plain-vendor-token-value")
    split_key = KEY[:9] + "\n" + KEY[9:]
    service = make_service(capture=CaptureSettings(enabled=True, path="traffic"))
    service.root = tmp_path
    with BackgroundServer(service) as server:
        server.wait_ready()
        question = (
            f"What is 6 times 7? My keys are {unused}, {split_key} and plain-vendor-token-value"
        )
        reply = post(server, ask(question))
        assert reply.status_code == 200, reply.text
        body = {
            "request_id": reply.json()["id"],
            "reference_answer": "42",
            "comment": f"the env key is {unused[:12]}\n{unused[12:]}",
        }
        assert send_feedback(server.base_url, body).status_code == 200, body
    folder = tmp_path / "traffic"
    stored = files_text(folder)
    found = load_traffic(folder, [])
    [task] = found.train
    text = stored + json.dumps(task.to_record())
    for secret in (unused, KEY, "Unused8Key2In4", "3f9a7c21", "plain-vendor-token-value"):
        assert secret not in text, secret
    assert "What is 6 times 7? My keys are ***" in task.question and task.answer == "42"


# ------------------------------------------------------------------ over `conductor serve`


def _serve(tmp_path: Path, serving: dict | None, key: str) -> tuple[Path, ServeProcess]:
    project = make_project(tmp_path / "project", serving=serving)
    return project, ServeProcess(project, [], serve_env(tmp_path, CONDUCTOR_API_KEY=key))


def test_capture_off_no_question_reaches_disk(tmp_path):
    """The default: serve, ask a prepared question, send feedback on it, stop; no file under
    the project's ``data/`` holds the question."""
    project, process = _serve(tmp_path, None, KEY)
    before = snapshot(project / "data")  # the prepared splits hold the question already
    process.start()
    try:
        reply = httpx.post(
            f"{process.base_url}/chat/completions",
            json=ask(QUESTION),
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        feedback = send_feedback(
            process.base_url, {"request_id": reply.json()["id"], "verdict": "right"}
        )
        assert feedback.status_code == 404 and feedback.json()["error"]["code"] == "capture_off"
    finally:
        assert process.stop() == 0, process.output
    written = {
        path: data for path, data in snapshot(project / "data").items() if before.get(path) != data
    }
    # the response cache and the usage log: the scan covers real writes
    assert len(written) >= 2, sorted(written)
    assert not (project / "data" / "01_raw" / "traffic").exists()
    for path, data in written.items():
        assert QUESTION.encode() not in data, f"the question reached {path}"
    assert not (project / "data" / "01_raw" / "traffic" / "requests.jsonl").exists()


def test_capture_on_stores_the_question_and_never_the_key(tmp_path):
    """A planted key is the server's API key, sent in the Authorization header and quoted in
    the question; no file of the project holds it, the capture holds the question."""
    project, process = _serve(tmp_path, {"capture": {"enabled": True}}, PLANTED)
    process.start()
    try:
        reply = httpx.post(
            f"{process.base_url}/chat/completions",
            json=ask(f"{QUESTION} (my key is {PLANTED})"),
            headers={"Authorization": f"Bearer {PLANTED}", "X-Api-Key": PLANTED},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        feedback = send_feedback(
            process.base_url,
            {"request_id": reply.json()["id"], "verdict": "wrong", "comment": PLANTED},
            key=PLANTED,
        )
        assert feedback.status_code == 200 and feedback.json()["joinable"] is True
    finally:
        assert process.stop() == 0, process.output
    capture = project / "data" / "01_raw" / "traffic"
    assert QUESTION in (capture / "requests.jsonl").read_text()
    assert PLANTED not in files_text(project)
    assert PLANTED not in process.output
