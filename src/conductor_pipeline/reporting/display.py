"""Notebook display helpers: figures as embedded PNG, tables, and notes for missing inputs.

A report should render even when one of its inputs is missing (no MLflow run id, no rollout
samples, no champion yet). Report functions raise :class:`MissingInput` for that case; the
notebook wraps each section in :func:`section`, which shows a visible note instead of the
section. Any other exception is a real error and fails the notebook (and the node).
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from typing import Any


class MissingInput(LookupError):
    """An input a report section needs is not there; the message says what and why."""


def figure_png(figure: Any) -> bytes:
    """A matplotlib figure as PNG bytes (no display or pyplot state needed)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight", dpi=110)
    return buffer.getvalue()


def new_figure(width: float = 8.0, height: float = 4.5):
    """A matplotlib ``Figure`` detached from pyplot (nothing leaks between reports)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110)


def note(text: str, *, kind: str = "missing") -> None:
    """A visible callout in the report (``kind``: missing, info, warning)."""
    from IPython.display import HTML, display

    colours = {"missing": "#fff4e5", "info": "#eef6ff", "warning": "#fdecea"}
    labels = {"missing": "Not available", "info": "Note", "warning": "Warning"}
    display(
        HTML(
            f'<div style="background:{colours.get(kind, "#eee")};padding:8px 12px;'
            f'border-radius:4px;margin:6px 0"><b>{labels.get(kind, "Note")}:</b> '
            f"{html.escape(text)}</div>"
        )
    )


def show(item: Any) -> None:
    """Display a figure (as an embedded PNG), a DataFrame (as a table), a string
    (as Markdown), or a list/tuple of those."""
    from IPython.display import Image, Markdown, display

    if item is None:
        return
    if isinstance(item, list | tuple):
        for part in item:
            show(part)
        return
    if hasattr(item, "savefig"):
        display(Image(data=figure_png(item), format="png"))
        return
    if isinstance(item, str):
        display(Markdown(item))
        return
    display(item)


def section(title: str, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A report section: a heading, then whatever ``build(*args, **kwargs)`` returns,
    or a note when it raises :class:`MissingInput`. Returns the built value (or None)."""
    from IPython.display import Markdown, display

    display(Markdown(f"## {title}"))
    try:
        value = build(*args, **kwargs)
    except MissingInput as missing:
        note(str(missing))
        return None
    show(value)
    return value
