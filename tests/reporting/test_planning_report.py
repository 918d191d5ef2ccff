"""The evaluation report's section "How the Conductor plans, by domain and difficulty": the
per domain x difficulty table of the conductor and its warm start, the sentence on steps by
difficulty and the figure, from hand-made per-question rows."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from conductor_pipeline.evaluation.routing import NO_WORKFLOW, planning_by_difficulty
from conductor_pipeline.reporting import MissingInput
from conductor_pipeline.reporting import evaluation as ev

WORKERS = ["sim-a", "sim-b", "sim-c"]


def _detail(*steps: tuple[str, list[int]]) -> str:
    """A record's detail whose final workflow has ``steps`` (worker name, access)."""
    return json.dumps(
        {
            "workflow": [
                {"index": i, "worker": WORKERS.index(w), "worker_name": w, "access": access}
                for i, (w, access) in enumerate(steps)
            ],
            "worker_names": WORKERS,
        }
    )


SINGLE_A = _detail(("sim-a", []))
SOLVE_CHECK = _detail(("sim-a", []), ("sim-b", [0]))
CHAIN = _detail(("sim-a", []), ("sim-b", [0]), ("sim-c", [1]))


def _row(system, domain, difficulty, detail, correct, *, split="test", infra=False) -> dict:
    return {
        "system": system,
        "split": split,
        "domain": domain,
        "difficulty": difficulty,
        "correct": correct,
        "infra_failure": infra,
        "detail": detail,
    }


def results() -> pd.DataFrame:
    rows = [
        # conductor, maths: one step on easy questions, two and three on hard ones
        _row("conductor", "math", "hard", SOLVE_CHECK, True),
        _row("conductor", "math", "hard", CHAIN, True),
        _row("conductor", "math", "hard", "{}", False),  # parse failure: no workflow
        _row("conductor", "math", "easy", SINGLE_A, True),
        _row("conductor", "math", "easy", SINGLE_A, False),
        # conductor, logic: one medium question answered, one lost to the infrastructure
        _row("conductor", "logic", "medium", SOLVE_CHECK, True),
        _row("conductor", "logic", "medium", CHAIN, False, infra=True),
        # the warm start: one step everywhere
        _row("warm-start", "math", "easy", SINGLE_A, False),
        _row("warm-start", "math", "hard", _detail(("sim-c", [])), True),
        _row("warm-start", "math", "hard", _detail(("sim-c", [])), False),
        # not in the table: another split, a baseline
        _row("conductor", "math", "hard", SINGLE_A, True, split="validation"),
        _row("solo:sim-a", "math", "hard", SINGLE_A, True),
    ]
    return pd.DataFrame(rows)


def _cell(table: pd.DataFrame, system: str, domain: str, difficulty: str) -> dict:
    rows = table[
        (table["system"] == system)
        & (table["domain"] == domain)
        & (table["difficulty"] == difficulty)
    ]
    assert len(rows) == 1, (system, domain, difficulty)
    return rows.iloc[0].to_dict()


def test_planning_by_difficulty_counts_each_cell():
    table = planning_by_difficulty(results())
    hard = _cell(table, "conductor", "math", "hard")
    assert hard["questions"] == 3
    assert hard["multi_step_share"] == pytest.approx(2 / 3)
    assert hard["mean_steps"] == pytest.approx(2.5)  # the question without a workflow is no 0
    # solve_check, chain and (no workflow) once each: the tie goes to the first in SHAPES
    assert (hard["top_shape"], hard["top_shape_share"]) == ("solve_check", pytest.approx(1 / 3))
    # sim-b and sim-c answer once each: the tie goes to the first name
    assert (hard["answer_worker"], hard["answer_worker_share"]) == ("sim-b", pytest.approx(1 / 3))
    assert hard["accuracy"] == pytest.approx(2 / 3)
    easy = _cell(table, "conductor", "math", "easy")
    assert easy["questions"] == 2 and easy["multi_step_share"] == 0.0
    assert easy["mean_steps"] == 1.0 and easy["top_shape"] == "single"
    assert (easy["answer_worker"], easy["answer_worker_share"]) == ("sim-a", 1.0)
    assert easy["accuracy"] == 0.5
    # the infrastructure failure is left out, as in the summary
    medium = _cell(table, "conductor", "logic", "medium")
    assert medium["questions"] == 1 and medium["accuracy"] == 1.0 and medium["mean_steps"] == 2.0


def test_planning_rows_are_in_system_domain_difficulty_order_with_all_domains_last():
    table = planning_by_difficulty(results())
    assert list(dict.fromkeys(table["system"])) == ["conductor", "warm-start"]
    conductor = table[table["system"] == "conductor"]
    assert list(zip(conductor["domain"], conductor["difficulty"], strict=True)) == [
        ("logic", "medium"),
        ("math", "easy"),
        ("math", "hard"),
        ("(all)", "easy"),
        ("(all)", "medium"),
        ("(all)", "hard"),
    ]
    overall = _cell(table, "conductor", "(all)", "hard")
    assert overall["questions"] == 3  # the validation row is not counted
    assert set(table["system"]) == {"conductor", "warm-start"}  # no baseline


def test_a_cell_without_any_workflow():
    frame = pd.DataFrame([_row("conductor", "code", "hard", "{}", False)] * 2)
    cell = _cell(planning_by_difficulty(frame), "conductor", "code", "hard")
    assert math.isnan(cell["mean_steps"]) and cell["multi_step_share"] == 0.0
    assert (cell["top_shape"], cell["top_shape_share"]) == (NO_WORKFLOW, 1.0)
    assert (cell["answer_worker"], cell["answer_worker_share"]) == (NO_WORKFLOW, 1.0)


def test_the_sentence_answers_whether_it_spends_more_steps_on_hard_questions():
    sentence = ev.steps_by_difficulty_sentence(ev.planning(results()))
    assert sentence.endswith(
        "Yes: the Conductor uses 2.5 steps on hard questions and 1.0 on easy ones; "
        "the warm start 1.0 and 1.0."
    )


def test_the_sentence_when_steps_do_not_rise_or_only_one_level_is_there():
    same = results()
    same["detail"] = SINGLE_A
    assert "No: the Conductor uses 1.0 steps on hard questions and 1.0 on easy ones" in (
        ev.steps_by_difficulty_sentence(ev.planning(same))
    )
    easy_only = results()
    easy_only = easy_only[easy_only["difficulty"] == "easy"]
    sentence = ev.steps_by_difficulty_sentence(ev.planning(easy_only))
    assert "cannot tell: every test question is easy" in sentence
    assert "uses 1.0 steps per workflow; the warm start 1.0" in sentence


def test_the_section_shows_both_systems_side_by_side():
    parts = ev.planning_section(results())
    sentence, figure, table = parts[0], parts[1], parts[2]
    assert sentence.startswith("**Does it spend more steps on hard questions?**")
    assert [ax.get_title() for ax in figure.axes] == ["conductor", "warm-start"]
    assert list(table.columns.get_level_values(0).unique()) == ["conductor", "warm-start"]
    assert table.loc[("math", "hard"), ("conductor", "most common shape")] == "solve_check, 33%"
    assert table.loc[("math", "hard"), ("warm-start", "answer worker")] == "sim-c (sim), 100%"
    assert table.loc[("math", "hard"), ("conductor", "mean steps")] == "2.50"
    # the warm start answered no logic question: its cells are empty, not NaN
    assert table.loc[("logic", "medium"), ("warm-start", "questions")] == ""
    assert list(table.index)[-3:] == [("(all)", "easy"), ("(all)", "medium"), ("(all)", "hard")]


def test_without_a_warm_start_the_conductor_is_shown_alone():
    frame = results()
    parts = ev.planning_section(frame[frame["system"] != "warm-start"])
    assert "warm start" not in parts[0]
    assert any("no warm-start rows" in p for p in parts if isinstance(p, str))


def test_no_conductor_rows_is_a_missing_input():
    frame = results()
    with pytest.raises(MissingInput):
        ev.planning_section(frame[frame["system"] == "solo:sim-a"])
