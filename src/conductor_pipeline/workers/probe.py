"""Before a run: can every configured worker be reached with its key?

:func:`check_worker_pool` returns one message per problem, all of them, never raising on
the first: a key that is missing (the environment variable or credentials entry, never its
value), an endpoint that does not answer, one that rejects the key or does not serve the
configured model, a hosted provider that refuses a request.

How each worker is probed:

- a worker with ``api_base`` (a self-hosted vLLM or any OpenAI-compatible server):
  ``GET <api_base>/models`` with the key as bearer token; it must answer and list the
  model (the part of ``model`` after litellm's provider prefix). No tokens are generated.
  Workers that share an endpoint share one request.
- a hosted provider (no ``api_base``): its key must be set; with ``hosted_completion`` it
  also gets one short chat request through the worker's own settings (no cache, no
  retries), which costs a fraction of a cent and proves the key, the model name and the
  account's access.

A ``sandbox`` pool is started by the run itself and needs no probe.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from conductor_pipeline.workers.config import WorkerConfigError, WorkerSpec, load_worker_specs

__all__ = ["PROBE_MESSAGES", "check_worker_pool", "served_model_name"]

PROBE_MESSAGES = [{"role": "user", "content": "Reply with the single word OK."}]
_KEY_FIX = (
    "export it, or name an entry of conf/local/credentials.yml with credentials_key "
    "(docs/sandbox.md, 'Adding a real provider')"
)


def served_model_name(model: str) -> str:
    """The name an OpenAI-compatible server lists for a litellm model string
    (``hosted_vllm/Qwen/Qwen3-32B`` → ``Qwen/Qwen3-32B``)."""
    return model.split("/", 1)[1] if "/" in model else model


def _key_problem(
    entry: Mapping[str, Any], credentials: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[str, str] | None:
    """``(what is missing, the message after the workers' names)`` or ``None``."""
    env_name = entry.get("api_key_env")
    cred_name = entry.get("credentials_key")
    if env_name and not environ.get(env_name):
        return f"env:{env_name}", f"API key missing: {env_name} is not set. Fix: {_KEY_FIX}"
    if cred_name and cred_name not in credentials:
        return f"cred:{cred_name}", (
            f"API key missing: credentials entry {cred_name!r} is not in the profile's "
            "credentials.yml. Fix: add it to conf/local/credentials.yml (never committed)"
        )
    return None


class _Problems:
    """Problems keyed by the missing thing, each naming every worker it affects, in the
    order they were found: a key or an endpoint shared by several workers is one line."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[list[str], str]] = {}

    def add(self, key: str, worker: str, message: str) -> None:
        workers, _ = self._found.setdefault(key, ([], message))
        if worker not in workers:
            workers.append(worker)

    def messages(self) -> list[str]:
        return [
            f"{'worker' if len(workers) == 1 else 'workers'} {', '.join(workers)}: {message}"
            for workers, message in self._found.values()
        ]


def _spec(
    entry: Mapping[str, Any],
    defaults: Mapping[str, Any],
    credentials: Mapping[str, Any],
    environ: Mapping[str, str],
    timeout_s: float,
) -> WorkerSpec:
    """The worker alone (its fallbacks are probed as workers of their own), with the
    probe's timeout and no retries, so a dead endpoint fails in ``timeout_s``."""
    alone = {k: v for k, v in entry.items() if k != "fallbacks"}
    alone.update(timeout_s=timeout_s, num_retries=0)
    return load_worker_specs(
        {"workers": [alone], "defaults": defaults}, credentials, environ=environ
    )[0]


def _get_models(api_base: str, key: str | None, timeout_s: float) -> tuple[list[str] | None, str]:
    """``(listed model ids, "")`` or ``(None, why not)``."""
    request = urllib.request.Request(api_base.rstrip("/") + "/models")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            body = json.loads(response.read().decode("utf-8") or "{}")
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            return None, f"rejects the key (HTTP {err.code})"
        return None, f"answers GET /models with HTTP {err.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        reason = getattr(err, "reason", err)
        return None, f"does not answer ({reason})"
    except ValueError:
        return None, "answers GET /models with something other than JSON"
    data = body.get("data") if isinstance(body, dict) else None
    ids = [str(item.get("id")) for item in data or [] if isinstance(item, dict)]
    return ids, ""


def _endpoint_problem(
    spec: WorkerSpec, listing: tuple[list[str] | None, str], key_env: str | None
) -> tuple[str, str] | None:
    """``(what is wrong, the message after the workers' names)`` or ``None``."""
    ids, why = listing
    where = f"endpoint {spec.api_base}"
    wanted = served_model_name(spec.model)
    if ids is None:
        if why.startswith("rejects the key"):
            source = f"the key in {key_env}" if key_env else "its key"
            fix = f"set {source} to the key the server was started with"
        else:
            fix = (
                f"start the server for {wanted} there (docs/sandbox.md, 'Adding a real provider'), or "
                "correct api_base in the profile's workers.yml"
            )
        return f"{spec.api_base}:{why}", f"{where} {why}. Fix: {fix}"
    if wanted not in ids:
        return f"{spec.api_base}:{wanted}", (
            f"{where} answers but does not serve {wanted!r} (it lists {ids}). Fix: start it "
            "with that model (or --served-model-name), or correct the worker's model"
        )
    return None


async def _hosted_problem(spec: WorkerSpec) -> str | None:
    from conductor_pipeline.workers.pool import WorkerPool

    pool = WorkerPool([spec])
    try:
        reply = await pool.call(0, PROBE_MESSAGES)
    finally:
        await pool.aclose()
    if reply.failure is None:
        return None
    return (
        f"{spec.model} refused a one-line request "
        f"({reply.failure.value}: {reply.error}). Fix: check the key, the model name and the "
        "account's access to it"
    )


def check_worker_pool(
    config: Mapping[str, Any],
    credentials: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    hosted_completion: bool = False,
) -> list[str]:
    """The problems of the ``worker_pool`` configuration ``config`` (``conf/*/workers.yml``),
    one message per missing key, unreachable endpoint or refused worker, naming the workers
    it affects; ``[]``: all can be reached. Keys are never part of a message. See the
    module docstring for the probes."""
    import os

    environ = os.environ if environ is None else environ
    credentials = credentials or {}
    if config.get("kind") == "sandbox":
        return []
    defaults = config.get("defaults") or {}
    problems = _Problems()
    listed: list[tuple[WorkerSpec, str | None, tuple[str, str]]] = []
    hosted: list[WorkerSpec] = []
    for position, raw in enumerate(config.get("workers") or []):
        entry = {**defaults, **raw} if isinstance(raw, Mapping) else {}
        name = str(entry.get("name") or f"workers[{position}]")
        missing_key = _key_problem(entry, credentials, environ)
        if missing_key:
            problems.add(missing_key[0], name, missing_key[1])
            if not entry.get("api_base"):
                continue  # a hosted provider cannot be asked anything without its key
            # a self-hosted endpoint can still be checked, without a key
            entry = {k: v for k, v in entry.items() if k not in ("api_key_env", "credentials_key")}
        try:
            spec = _spec(entry, {}, credentials, environ, timeout_s)
        except WorkerConfigError as err:
            problems.add(f"config:{name}", name, str(err))
            continue
        if spec.api_base:
            key = spec.api_key.get() if spec.api_key else None
            listed.append((spec, entry.get("api_key_env"), (spec.api_base, key or "")))
        elif hosted_completion:
            hosted.append(spec)
    listings: dict[tuple[str, str], tuple[list[str] | None, str]] = {}
    for _, _, endpoint in listed:
        if endpoint not in listings:
            listings[endpoint] = _get_models(endpoint[0], endpoint[1] or None, timeout_s)
    for spec, key_env, endpoint in listed:
        problem = _endpoint_problem(spec, listings[endpoint], key_env)
        if problem:
            problems.add(problem[0], spec.name, problem[1])
    if hosted:

        async def ask_all() -> list[str | None]:
            return await asyncio.gather(*(_hosted_problem(spec) for spec in hosted))

        for spec, problem in zip(hosted, asyncio.run(ask_all()), strict=True):
            if problem:
                problems.add(f"hosted:{spec.name}", spec.name, problem)
    return problems.messages()
