"""An append-only JSONL file of evaluated pairs, so that a killed evaluation resumes.

Each line is one :class:`QuestionResult`, keyed by (system, question id, variant). The
variant fingerprints everything a result depends on (the Conductor version, the pool, the
system's settings), so a new Conductor version is evaluated afresh while the baselines it
shares with the previous one are reused. A line cut short by a kill is ignored on load;
when a key occurs twice the later line wins.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from conductor_pipeline.evaluation.records import QuestionResult

logger = logging.getLogger(__name__)


class ResultStore:
    """``path``: the JSONL file (created with its folder on first write); ``None`` keeps
    results in memory only."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._results: dict[tuple[str, str, str], QuestionResult] = {}
        self._lock = threading.Lock()
        self.skipped_lines = 0
        if self.path is not None and self.path.is_file():
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        with self.path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                line = line.strip()
                if not line:
                    continue
                try:
                    result = QuestionResult.from_json(json.loads(line))
                except (ValueError, TypeError) as err:
                    self.skipped_lines += 1
                    logger.warning(
                        "%s:%d: unreadable result line skipped (%s)", self.path, number, err
                    )
                    continue
                self._results[result.key] = result

    def __len__(self) -> int:
        return len(self._results)

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        return key in self._results

    def get(self, system: str, question_id: str, variant: str) -> QuestionResult | None:
        return self._results.get((system, question_id, variant))

    def add(self, result: QuestionResult) -> None:
        """Record ``result`` and append it to the file, flushed to disk before returning."""
        line = json.dumps(result.to_json(), default=str, sort_keys=True)
        with self._lock:
            self._results[result.key] = result
            if self.path is None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a+b") as handle:
                # a line cut short by a kill must not swallow the next one
                handle.seek(0, os.SEEK_END)
                if handle.tell() > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        handle.write(b"\n")
                handle.write(line.encode("utf-8") + b"\n")
                handle.flush()
                os.fsync(handle.fileno())

    def results(self) -> list[QuestionResult]:
        return list(self._results.values())
