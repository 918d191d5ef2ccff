"""A JSON dataset that loads as ``{}`` while its file does not exist yet.

The evaluation report shows the promotion decision when there is one; on a fresh project
(``kedro run --pipelines reporting`` before any promotion) there is none, and the report
says so instead of the run failing.
"""

from __future__ import annotations

from typing import Any

from kedro_datasets.json import JSONDataset


class OptionalJSONDataset(JSONDataset):
    def load(self) -> Any:
        if not self._exists():
            return {}
        return super().load()
