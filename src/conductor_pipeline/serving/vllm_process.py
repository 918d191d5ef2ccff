"""What the policy server's launcher checks around the vLLM process it starts.

* Before the launch, :func:`port_in_use`: a server already listening on the configured port
  (a TRL training server, a vLLM left over from an earlier run) would answer ``/health``
  in place of ours, so the launch is refused with what answers there.
* During start-up, :func:`served_names`: ``GET /v1/models`` must list every name the
  command asked vLLM to serve (the base model's and each LoRA module's); ``/health`` alone
  says that *a* server is up, not that it is ours or that it loaded the adapters.
* On stop, :func:`terminate_process_group`: vLLM runs its engine in child processes that
  hold the GPU; signalling only the process we started can leave them behind, so the whole
  process group (started with ``start_new_session=True``) is terminated.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def port_in_use(host: str, port: int) -> bool:
    """True when a socket already listens on ``host:port``.

    ``SO_REUSEADDR`` lets the probe bind over connections still in TIME_WAIT (a server
    stopped a moment ago), so only a live listener counts as in use.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror:
        return False  # vLLM reports the unusable host itself
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def describe_listener(base_url: str, api_key: str | None) -> str:
    """What answers at ``base_url``, in a few words, for an error message."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=2.0)
    except httpx.HTTPError:
        return "something that does not answer HTTP"
    if response.status_code != 200:
        return f"a server that answers GET /v1/models with HTTP {response.status_code}"
    names = _model_ids(response)
    if names is None:
        return "a server whose GET /v1/models is not an OpenAI model list"
    return f"a server that serves {names}"


def served_names(base_url: str, api_key: str | None) -> list[str] | None:
    """The model names ``GET /v1/models`` lists, or None when it gives no list."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=5.0)
    except httpx.HTTPError:
        return None
    return _model_ids(response) if response.status_code == 200 else None


def _model_ids(response) -> list[str] | None:
    try:
        data = response.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return sorted(str(item.get("id")) for item in data if isinstance(item, dict))


def _group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` still runs (zombies, which hold no memory and
    wait for their parent to reap them, do not count)."""
    proc = Path("/proc")
    if proc.is_dir():
        for stat in proc.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue  # exited while we looked
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def terminate_process_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the process group ``process`` leads, SIGKILL to what is left after
    ``grace_s``; ``process`` is reaped either way.

    ``process`` must have been started with ``start_new_session=True`` (its pid is then the
    group's id). Members that exit on their own but are not our children may linger as
    zombies until their new parent reaps them; those hold no memory.
    """
    pgid = process.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    # the leader is gone (or overdue): give the rest of the group what is left of the grace
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process.poll() is None or _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
    process.wait(timeout=max(grace_s, 5.0))
