"""Fixtures for the worker-pool tests: a local OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from .fake_openai_server import FakeOpenAIServer

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test here that opens a TCP connection to anything but loopback."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address: Any) -> None:
        if isinstance(address, tuple) and address[0] not in _LOOPBACK:
            raise ConnectionRefusedError(f"test tried to reach {address!r} (loopback only)")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture(scope="session")
def _fake_server_session() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def fake_server(_fake_server_session: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """The shared fake server, with modes and counters cleared for each test."""
    _fake_server_session.state.reset()
    yield _fake_server_session
    _fake_server_session.state.reset()


def worker_entry(server: FakeOpenAIServer, name: str, **extra: Any) -> dict[str, Any]:
    """A workers.yml entry that reaches ``server`` as ``openai/<name>``."""
    entry: dict[str, Any] = {
        "name": name,
        "model": f"openai/{name}",
        "description": f"test worker {name}",
        "api_base": server.api_base,
        "timeout_s": 5,
        "num_retries": 0,
        "max_concurrency": 16,
    }
    entry.update(extra)
    return entry
