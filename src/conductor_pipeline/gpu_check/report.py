"""The check's JSON document, written once on every exit path, and its time budget."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = Path("data/08_reporting/gpu_check.json")
# under the Makefile's 570 s limit, so that the watchdog's JSON is written before it strikes
DEFAULT_BUDGET_S = 540.0
EXIT_OK, EXIT_FAILED, EXIT_NO_CUDA, EXIT_TIMEOUT = 0, 1, 2, 3
EXIT_INCOMPLETE = 4  # a required part was skipped, or the weights are not on this machine
EXIT_DOES_NOT_FIT = 5  # everything ran, and the profile's run would not fit the GPU's memory
STATUS = {
    EXIT_OK: "ok",
    EXIT_FAILED: "failed",
    EXIT_NO_CUDA: "no-cuda",
    EXIT_TIMEOUT: "timeout",
    EXIT_INCOMPLETE: "incomplete",
    EXIT_DOES_NOT_FIT: "does-not-fit",
}


def compact_json(value: Any, indent: int = 0) -> str:
    """JSON with one key per line and lists of numbers or strings on one line, so that the
    whole report reads on one page."""
    pad = "  " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [
            f"{pad}{json.dumps(str(k))}: {compact_json(v, indent + 1)}" for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(value, list | tuple) and any(isinstance(v, dict | list) for v in value):
        items = [pad + compact_json(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(value, default=str)


class Report:
    """The JSON document being built; written on every exit path, the watchdog's included."""

    def __init__(self, path: Path, argv: Sequence[str], budget_s: float) -> None:
        self.path = path
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._written = False
        self.data: dict[str, Any] = {
            "status": "running",
            "message": "",
            "verdict": {},
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": list(argv),
            "budget_s": budget_s,
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, status: str, message: str) -> bool:
        """Record the outcome and write the file once; False when it was already written
        (a second call is ignored)."""
        with self._lock:
            if self._written:
                return False
            self.data["status"] = status
            self.data["message"] = message
            self.data["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
            self.data["wall_s"] = round(self.elapsed(), 2)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = None
            for _ in range(5):  # the watchdog may write while the main thread adds a key
                try:
                    text = compact_json(self.data)
                    break
                except RuntimeError:
                    time.sleep(0.05)
            if text is None:
                text = json.dumps({k: self.data[k] for k in ("status", "message", "budget_s")})
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, self.path)
            self._written = True
            return True


class Budget:
    """Cooperative checks between steps, plus a watchdog for a call that never returns
    (a hung kernel, a vLLM start that stalls): the check must end inside its 8 minutes."""

    def __init__(self, report: Report, seconds: float) -> None:
        self.report = report
        self.seconds = seconds
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        return self.seconds - self.report.elapsed()

    def _expire(self) -> None:
        # the main thread may have finished in the meantime: its verdict stands
        if not self.report.finish(
            "timeout",
            f"the check ran past its {self.seconds:.0f} s budget and was stopped; the sections "
            "recorded so far are in this file",
        ):
            return
        print(
            f"gpu-check: timeout after {self.seconds:.0f} s; see {self.report.path}",
            file=sys.stderr,
        )
        sys.stderr.flush()
        os._exit(EXIT_TIMEOUT)  # a hung CUDA call cannot be interrupted any other way
