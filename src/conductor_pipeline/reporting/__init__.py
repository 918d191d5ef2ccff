"""Reports: papermill-executed notebooks rendered to HTML, and the functions they call.

The notebooks in ``notebooks/`` stay thin (a ``parameters`` cell, then calls into this
package), so the logic is tested as plain Python:

- :mod:`.runner`: execute a notebook with papermill, render HTML without code cells;
- :mod:`.training`: curves from the training run's MLflow metric history;
- :mod:`.training_files`: the run's other files (registered version, adapter info, sample
  rollouts), re-exported by :mod:`.training`;
- :mod:`.evaluation`: summary table, cost–accuracy plot, heat maps, example workflows,
  promotion decision;
- :mod:`.headlines`: the computed opening paragraph of each report;
- :mod:`.display`: figures as embedded PNG, notes for missing inputs.

No Kedro here; MLflow only where a report reads a run or the registry.
"""

import warnings

from conductor_pipeline.reporting.display import MissingInput, headline, note, section, show
from conductor_pipeline.reporting.runner import (
    ReportFailed,
    ReportResult,
    check_kernel,
    execute_report,
    notebook_to_html,
)

# MLflow imports tqdm.auto, which warns in a kernel without ipywidgets; in a rendered report
# that warning is a red box about a progress bar the report never shows. Only that message.
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

__all__ = [
    "MissingInput",
    "ReportFailed",
    "ReportResult",
    "check_kernel",
    "execute_report",
    "headline",
    "note",
    "notebook_to_html",
    "section",
    "show",
]
