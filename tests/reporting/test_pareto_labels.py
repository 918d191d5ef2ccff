"""The cost–accuracy plot labels every system where a reader can read it: no label on top of
another, none on another system's marker, on the crowded layout of a real sandbox run."""

from __future__ import annotations

import itertools

import pandas as pd
from matplotlib.text import Text

from conductor_pipeline.evaluation.plots import pareto_figure

# (system, cost $/q, accuracy): the sandbox evaluation of a `make run`, where the Conductor
# sits next to solo:sim-sage and several solo workers crowd around $0.0002
SANDBOX = [
    ("conductor", 0.000885, 0.75),
    ("warm-start", 0.000162, 0.292),
    ("solo:sim-sage", 0.000943, 0.75),
    ("solo:sim-abacus", 0.000148, 0.542),
    ("solo:sim-coder", 0.000189, 0.656),
    ("solo:sim-sphinx", 0.000207, 0.479),
    ("solo:sim-sprout", 0.0000394, 0.271),
    ("solo:smollm2-135m", 0.0000072, 0.010),
    ("moa", 0.002064, 0.75),
    ("random-workflow", 0.000355, 0.469),
    ("best-of-n:sim-sage", 0.000943, 0.75),
    ("router", 0.000183, 0.833),
    ("handcrafted", 0.001205, 0.875),  # a specialist solves, sim-sage checks
    ("oracle", 0.000172, 0.979),
]


def _summary() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"system": s, "n": 96, "accuracy": a, "ci_low": max(a - 0.09, 0.0),
             "ci_high": min(a + 0.08, 1.0), "cost_usd_per_q": c, "simulated_pool": True}
            for s, c, a in SANDBOX
        ]
    )  # fmt: skip


def test_pareto_labels_do_not_overlap_each_other_or_the_markers():
    figure = pareto_figure(_summary())
    ax = figure.axes[0]
    renderer = figure.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text()]
    # solo:sim-sage and best-of-n:sim-sage share one point and one label
    assert len(labels) == len(SANDBOX) - 1
    # the text itself (an annotation's own extent also spans its leader line)
    for label in labels:
        label.update_positions(renderer)
    boxes = {t.get_text(): Text.get_window_extent(t, renderer) for t in labels}
    assert "handcrafted (told the domain)" in boxes  # its label says what it is told
    for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
        assert not box_a.overlaps(box_b), f"labels overlap: {a!r} and {b!r}"
    pad = 4.0 * figure.dpi / 72.0
    for system, cost, accuracy in SANDBOX:
        x, y = ax.transData.transform((cost, accuracy))
        for text, box in boxes.items():
            if system.split(":")[-1] in text:
                continue  # its own label starts next to it
            inside = box.x0 < x + pad and x - pad < box.x1 and box.y0 < y + pad and y - pad < box.y1
            assert not inside, f"label {text!r} covers the marker of {system}"
