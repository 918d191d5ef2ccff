"""What a reader of the reports sees: each fact stated once, tables with plain column labels,
code in questions shown as code, no duplicate or flat lines in the training curves, a blank
panel that says why, and example workflows as readable blocks."""

from __future__ import annotations

import json
import re

import pandas as pd

from conductor_pipeline.reporting import display
from conductor_pipeline.reporting import evaluation as ev
from conductor_pipeline.reporting import training as tr
from tests.reporting.conftest import make_results


def _text(part) -> str:
    """A section's output as the page would hold it (figures by their axis texts)."""
    if isinstance(part, list | tuple):
        return "\n".join(_text(p) for p in part)
    if isinstance(part, pd.DataFrame):
        return display.table_html(part)
    if hasattr(part, "savefig"):
        return " ".join(
            t.get_text() for ax in part.axes for t in [*ax.get_xticklabels(), ax.title, *ax.texts]
        )
    return str(part)


def _run(title, build, args, kwargs) -> str:
    try:
        return _text(build(*args, **kwargs))
    except ev.MissingInput as missing:
        return str(missing)


def test_single_step_workflows_are_stated_once_and_their_repeats_left_out():
    results = make_results(max_steps=1)  # every workflow one step
    sections = ev.results_sections(results, 1)
    titles = [title for title, *_ in sections]
    assert titles[0] == "Workflow structure"
    for repeated in ("Worker choice by domain", "Workflow shapes (% of questions)",
                     "Access patterns"):  # fmt: skip
        assert repeated not in titles
    page = "\n".join(_run(*part) for part in sections)
    assert page.count("single-step") == 1, page[:2000]
    assert "Not shown, as they would only repeat this" in page
    # the answer routing heat map keeps who answers, without an all-zero multi-step column
    routing = ev.routing_figure(results)
    assert "multi-step" not in " ".join(t.get_text() for t in routing.axes[0].get_xticklabels())
    # with multi-step workflows every panel is there
    titles = [title for title, *_ in ev.results_sections(make_results(), 1)]
    assert "Workflow structure" not in titles and "Access patterns" in titles


def test_tables_have_column_labels_and_no_index_names():
    results = make_results()
    for table in (ev.shape_shares(results), ev.access_patterns(results)):
        html = display.table_html(table)
        header = re.search(r"<thead>(.*?)</thead>", html, re.S).group(1)
        assert header.count("<tr") == 1, header  # no second header row for an index name
        assert "<th>value</th>" not in html and "<th>access_pattern</th>" not in html
        assert "<th></th>" not in html  # no unlabelled index column
        assert re.search(r"<th>system</th>", header)
    decision = {"version": "2", "decision": "promoted", "figures": {
        "challenger": {"accuracy": 0.8, "cost_usd_per_q": 0.001, "parse_rate": 1.0, "n": 10}}}  # fmt: skip
    table = next(p for p in ev.promotion_summary(decision) if isinstance(p, pd.DataFrame))
    html = display.table_html(table)
    assert "<th>figure</th>" in html and "cost_usd_per_q" not in html and "<th></th>" not in html


def test_code_in_a_question_is_shown_as_code_and_other_text_escaped():
    results = make_results()
    question = (
        "Implement the function in a single ```python code block.\n\n"
        "```python\ndef is_small(x):\n    return x < 2 and x * 2 > 0\n```\n\nKeep <b>it</b> short."
    )
    rows = results["system"] == "conductor"
    details = [json.loads(d) for d in results.loc[rows, "detail"]]
    results.loc[rows, "detail"] = [json.dumps({**d, "question": question}) for d in details]
    page = "".join(ev.example_workflows(results, correct=True, n=1))
    assert (
        '<pre><code class="language-python">def is_small(x):\n'
        "    return x &lt; 2 and x * 2 &gt; 0</code></pre>"
    ) in page
    assert "Keep &lt;b&gt;it&lt;/b&gt; short." in page
    assert "python code block. python def" not in page


def _flat_history() -> pd.DataFrame:
    reward = [0.5, 0.6, 0.8]
    cost = [0.001, 0.002, 0.0015]
    return pd.DataFrame(
        {
            "step": [1, 2, 3],
            "grpo/reward/mean": reward,
            "grpo/reward/correctness_mean": reward,  # no cost penalty paid
            "grpo/workflow/cost_usd_mean": cost,
            "grpo/workflow/list_cost_usd_mean": cost,  # no cache hits
            "grpo/workflow/steps_mean": [2.0, 2.0, 2.0],
        }
    )


def test_identical_series_are_one_line_and_a_constant_series_a_note():
    history = _flat_history()
    figure = tr.reward_figure(history)
    lines = figure.axes[0].get_lines()
    assert len(lines) == 1
    assert "mean reward" in lines[0].get_label() and "correctness" in lines[0].get_label()
    figure, note = tr.cost_figure(history)
    drawn = [line for ax in figure.axes for line in ax.get_lines()]
    assert len(drawn) == 1, [line.get_label() for line in drawn]
    assert "list price" in drawn[0].get_label()
    assert "steps per workflow" in note and "2 at every step" in note


def test_a_blank_stretch_of_a_domain_panel_says_which_steps_lack_data():
    history = pd.DataFrame(
        {
            "step": [1, 2, 3],
            "grpo/reward/mean": [0.1, 0.2, 0.3],
            "grpo/domain/math/worker/sim-sage": [0.5, 1.0, 1.0],
            "grpo/domain/math/worker/sim-coder": [0.5, 0.0, 0.0],
            "grpo/domain/logic/worker/sim-sage": [1.0, 0.4, None],  # logic not sampled at 3
            "grpo/domain/logic/worker/sim-coder": [0.0, 0.6, None],
        }
    )
    figure = tr.routing_figure(history)
    logic = next(ax for ax in figure.axes if ax.get_title().startswith("logic"))
    notes = " ".join(t.get_text() for t in logic.texts)
    assert "no logic answer shares logged at step 3" in notes
    math_panel = next(ax for ax in figure.axes if ax.get_title().startswith("math"))
    assert not math_panel.texts


def test_rollout_examples_are_readable_blocks_cut_at_a_word(tmp_path):
    question = "Sort these words: " + " ".join(f"word{i:03d}" for i in range(200))
    samples = tmp_path / "rollout_samples.jsonl"
    completion = (
        "A math question.\nmodel_id = [1, 0]\n"
        "subtasks = ['Solve the question.', 'Check the answer above.']\n"
        'access_list = [[], "all"]'
    )
    samples.write_text(
        "\n".join(
            json.dumps(
                {
                    "step": s,
                    "question": question,
                    "completion": completion,
                    "reward": 1.0,
                    "parsed": True,
                }
            )  # fmt: skip
            for s in (1, 2)
        )
    )
    parts = tr.rollout_examples(samples, per_phase=1, worker_names=["sim-sage", "sim-coder"])
    blocks = [str(p) for p in parts if "workflow-example" in str(p)]
    assert len(blocks) == 2
    block = blocks[0]
    assert "*reward" not in block and "reward 1.00" in block
    items = re.findall(r"<li>(.*?)</li>", block, re.S)
    assert len(items) == 2
    assert "<b>sim-coder</b>, sees only the question" in items[0]
    assert "Solve the question." in items[0]
    assert "<b>sim-sage</b>, sees all earlier steps" in items[1]
    shown = re.search(r"<p>(Sort these words:.*?)</p>", block).group(1)
    assert shown.endswith("…")
    kept = shown[:-1].split()
    assert kept[-1] in question.split(), "cut inside a word"
