"""Notebook display helpers: figures as embedded PNG, tables, and notes for missing inputs.

A report should render even when one of its inputs is missing (no MLflow run id, no rollout
samples, no champion yet). Report functions raise :class:`MissingInput` for that case; the
notebook wraps each section in :func:`section`, which shows a visible note instead of the
section. Any other exception is a real error and fails the notebook (and the node).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable
from typing import Any


class MissingInput(LookupError):
    """An input a report section needs is not there; the message says what and why."""


class HtmlBlock(str):
    """A piece of report HTML shown as it is (:func:`show`); whoever builds it escapes the
    text it holds."""


def figure_png(figure: Any) -> bytes:
    """A matplotlib figure as PNG bytes (no display or pyplot state needed)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight", dpi=110)
    return buffer.getvalue()


def figure_alt_text(figure: Any) -> str:
    """What a figure shows, for readers who cannot see it: its titles and axis labels."""
    parts = []
    if figure.get_suptitle():
        parts.append(figure.get_suptitle())
    for axes in figure.axes:
        labels = [axes.get_ylabel(), axes.get_xlabel()]
        described = " by ".join(label for label in labels if label)
        title = axes.get_title()
        if title or described:
            parts.append(f"{title}: {described}" if title and described else title or described)
    return "; ".join(parts) or "A chart of this report"


def figure_html(figure: Any) -> str:
    """A figure as an ``<img>`` with alternative text (the HTML export warns about any image
    without one, and a screen reader has nothing else to read)."""
    data = base64.b64encode(figure_png(figure)).decode("ascii")
    alt = html.escape(figure_alt_text(figure), quote=True)
    return f'<img alt="{alt}" src="data:image/png;base64,{data}">'


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


def _plain_number(value: Any) -> Any:
    """A whole float as an int (24.0 -> 24), anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def tidy_table(frame: Any) -> Any:
    """A copy of a DataFrame where columns of whole numbers show as ints, not ``24.000000``
    (pandas turns an int column into float as soon as one cell is missing; a column that mixes
    counts and shares keeps its shares, its counts lose the trailing zeros)."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        return frame
    out = frame.copy()
    for column in out.columns:
        values = out[column]
        if values.dtype == object or pd.api.types.is_float_dtype(values):
            floats = [v for v in values if isinstance(v, float) and math.isfinite(v)]
            if floats and all(v.is_integer() for v in floats):
                out[column] = values.map(_plain_number).astype(object).where(values.notna(), "")
            elif values.dtype == object:
                out[column] = values.map(_plain_number)
    return out


def show(item: Any) -> None:
    """Display a figure (as an embedded PNG), a DataFrame (as a table, :func:`table_html`),
    an :class:`HtmlBlock` (as HTML), any other string (as Markdown), or a list/tuple of
    those."""
    from IPython.display import HTML, Markdown, display

    if item is None:
        return
    if isinstance(item, list | tuple):
        for part in item:
            show(part)
        return
    if hasattr(item, "savefig"):
        display(HTML(figure_html(item)))
        return
    if isinstance(item, HtmlBlock):
        display(HTML(item))
        return
    if isinstance(item, str):
        display(Markdown(item))
        return
    if _is_table(item):
        display(HTML(table_html(item)))
        return
    display(item)


def _is_table(item: Any) -> bool:
    import pandas as pd

    return isinstance(item, pd.DataFrame)


def table_frame(frame: Any) -> Any:
    """The table as a reader sees it (:func:`tidy_table`): row labels become ordinary
    columns named after them, and no header names the index or the columns' axis (pandas
    would print ``system`` or ``value`` on a header row of its own)."""
    import pandas as pd

    out = tidy_table(frame)
    plain = (
        isinstance(out.index, pd.RangeIndex)
        and out.index.start == 0
        and out.index.step == 1
        and out.index.name is None
    )
    if not plain:
        # 0, 1, 2 … in front of every row tells a reader nothing; real row labels do
        names = [name or "" for name in out.index.names]
        out = out.copy()
        out.index.names = [name if name not in out.columns else f"{name} " for name in names]
        out = out.reset_index()
    else:
        out = out.copy()
    out.columns.names = [None] * out.columns.nlevels
    return out


def table_html(frame: Any) -> str:
    """A DataFrame as the report's HTML table: :func:`table_frame`, without row numbers."""
    return table_frame(frame).to_html(index=False, classes="dataframe", border=1)


def section(title: str, build: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """A report section: a heading, then whatever ``build(*args, **kwargs)`` returns,
    or a note when it raises :class:`MissingInput`.

    Returns None on purpose: a notebook cell whose last line is ``section(...)`` would
    otherwise display the value a second time (a table twice, a figure as its repr)."""
    from IPython.display import Markdown, display

    display(Markdown(f"## {title}"))
    try:
        value = build(*args, **kwargs)
    except MissingInput as missing:
        note(str(missing))
        return
    show(value)


def headline(build: Callable[..., str], *args: Any, **kwargs: Any) -> None:
    """The report's opening paragraph: ``build(*args, **kwargs)`` (Markdown) in a framed box
    above everything else, or a note saying why there is none (:class:`MissingInput`)."""
    from IPython.display import Markdown, display

    try:
        text = build(*args, **kwargs)
    except MissingInput as missing:
        note(f"no headline: {missing}")
        return
    display(Markdown(text))
