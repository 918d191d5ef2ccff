"""Example workflows as readable blocks, for both reports: the question (its code shown as
code), then each step with its worker, subtask, which earlier steps it sees and an excerpt
of its answer. Long text is cut at a word boundary and ends with an ellipsis; everything
else is escaped, so a question's ``<`` or ``*`` reaches the page as written."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import HtmlBlock, MissingInput
from conductor_pipeline.reporting.evaluation_inputs import as_count

QUESTION_CHARS = 600
SUBTASK_CHARS = 300
ANSWER_CHARS = 240
# a fenced block: ``` at the start of a line, up to a closing ``` line (an unclosed one runs to
# the end of the shortened text); a ``` inside a sentence ("in a ```python block") is prose
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.S | re.M)


def shorten(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters, cut at the last whitespace before it (not inside
    a word) and ended with "…"; unchanged when it fits."""
    text = str(text).strip()
    if len(text) <= limit:
        return text
    head = text[: limit + 1]
    space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    # a single very long word is cut where it must be
    head = head[:space] if space > limit // 2 else text[:limit]
    return head.rstrip(" \t\n,;:") + "…"


def _prose_html(text: str) -> str:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "".join(
        f"<p>{'<br>'.join(html.escape(line) for line in p.splitlines())}</p>" for p in paragraphs
    )


def text_html(text: str, limit: int) -> str:
    """Free text as HTML: fenced code as ``<pre><code>``, the rest escaped paragraphs; cut
    to ``limit`` characters at a word boundary first."""
    text = shorten(text, limit)
    parts, position = [], 0
    for match in _FENCE.finditer(text):
        parts.append(_prose_html(text[position : match.start()]))
        language = f' class="language-{html.escape(match.group(1))}"' if match.group(1) else ""
        code = match.group(2).strip("\n")
        parts.append(f"<pre><code{language}>{html.escape(code)}</code></pre>")
        position = match.end()
    parts.append(_prose_html(text[position:]))
    return "".join(parts)


def _sees(access: Any) -> str:
    if access == "all":
        return "all earlier steps"
    steps = [int(a) + 1 for a in (access or [])]
    if not steps:
        return "only the question"
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))


def workflow_block(
    title: str,
    facts: list[str],
    question: str,
    steps: list[dict[str, Any]],
    *,
    remark: str = "",
) -> HtmlBlock:
    """One example: ``title`` and ``facts`` on the first line, the question, then the
    steps in order (numbered from 1; ``access`` lists 0-based step indices or is
    ``"all"``), each ``worker``, ``subtask`` and, where there is one, ``answer``."""
    lines = [
        '<div class="workflow-example" style="border:1px solid #ddd;border-radius:4px;'
        'padding:6px 12px;margin:8px 0">',
        f"<p><b>{html.escape(title)}</b>"
        + "".join(f" · {html.escape(fact)}" for fact in facts if fact)
        + "</p>",
    ]
    if question:
        lines.append(f"<div><b>Question</b>{text_html(question, QUESTION_CHARS)}</div>")
    if remark:
        lines.append(f"<p><i>{html.escape(remark)}</i></p>")
    if steps:
        lines.append("<ol>")
        for step in steps:
            item = (
                f"<li><b>{html.escape(str(step.get('worker')))}</b>, sees "
                f"{html.escape(_sees(step.get('access')))}<br>subtask: "
                f"{html.escape(shorten(str(step.get('subtask') or ''), SUBTASK_CHARS))}"
            )
            if step.get("answer"):
                item += f"<br>answer:{text_html(str(step['answer']), ANSWER_CHARS)}"
            lines.append(item + "</li>")
        lines.append("</ol>")
    lines.append("</div>")
    return HtmlBlock("\n".join(lines))


def _evaluated_steps(detail: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "worker": s.get("worker_name") or s.get("worker"),
            "access": list(s.get("access") or []),
            "subtask": s.get("subtask"),
            "answer": s.get("response") or s.get("failure") or "",
        }
        for s in detail.get("workflow") or []
    ]


def _steps_text(value: Any) -> str:
    steps = as_count(value)
    return f"{steps} step" + ("" if steps == 1 else "s")


def example_workflows(
    results: pd.DataFrame, *, correct: bool, system: str = "conductor", n: int = 2, seed: int = 0
) -> list[Any]:
    """``n`` of the ``system``'s questions it got right (or wrong), each as a block
    (:func:`workflow_block`): the question, then each step's worker, subtask, what it sees
    and its answer."""
    rows = results[(results["system"] == system) & (results["correct"].astype(bool) == correct)]
    if rows.empty:
        raise MissingInput(f"no question the {system} answered {'right' if correct else 'wrong'}")
    # one per domain first, so the examples are varied
    picked = rows.sample(frac=1.0, random_state=seed).drop_duplicates("domain").head(n)
    if len(picked) < n:
        rest = rows.drop(picked.index).sample(frac=1.0, random_state=seed)
        picked = pd.concat([picked, rest.head(n - len(picked))])
    parts: list[Any] = []
    for row in picked.to_dict(orient="records"):
        try:
            detail = json.loads(row.get("detail") or "{}")
        except ValueError:
            detail = {}
        answer = shorten(str(row.get("extracted") or row.get("answer") or ""), 80)
        facts = [
            f"{row['domain']}, {row['difficulty']}",
            f"answer {answer}" if answer else "no answer",
            str(row.get("verdict") or ("correct" if correct else "wrong")),
            _steps_text(row.get("n_steps")),
            f"${float(row.get('cost_usd') or 0):.6f}",
        ]
        remark = (
            "The Conductor wrote no parseable workflow for this question."
            if row.get("parse_failure")
            else ""
        )
        steps = [] if remark else _evaluated_steps(detail)
        parts.append(
            workflow_block(
                str(row["question_id"]),
                facts,
                str(detail.get("question") or ""),
                steps,
                remark=remark,
            )
        )
    return parts
