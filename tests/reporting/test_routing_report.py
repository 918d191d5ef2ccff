"""The evaluation report's routing section: answer-step workers per domain for the conductor
and its warm start side by side, and the workflow shapes of every Conductor system."""

from __future__ import annotations

import pandas as pd
import pytest

from conductor_pipeline.reporting import MissingInput
from conductor_pipeline.reporting import evaluation as ev
from tests.reporting.conftest import DOMAINS, WORKERS, make_results


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    """The fixture evaluation plus a warm start that answers everything with one sim-sprout
    step."""
    frame = make_results()
    warm = frame[frame["system"] == "conductor"].copy()
    warm["system"] = "warm-start"
    warm["detail"] = [
        '{"workflow": [{"index": 0, "worker": 3, "worker_name": "sim-sprout", "subtask": "s", '
        '"access": []}], "worker_names": ' + str(WORKERS).replace("'", '"') + "}"
    ] * len(warm)
    return pd.concat([frame, warm], ignore_index=True)


def test_answer_routing_rows_are_domains_columns_workers_then_multi_step(results):
    table = ev.routing(results)
    warm = ev.answer_routing(table, "warm-start")
    assert list(warm.index) == [*sorted(DOMAINS), "(all)"]
    assert list(warm.columns) == [*WORKERS, "multi-step"]  # no "(no workflow)": none missing
    assert (warm["sim-sprout"] == 1.0).all() and (warm["multi-step"] == 0.0).all()
    conductor = ev.answer_routing(table, "conductor")
    assert conductor[WORKERS].sum(axis=1).to_numpy() == pytest.approx(1.0)
    assert 0.0 < conductor.loc["(all)", "multi-step"] < 1.0


def test_the_routing_figure_puts_the_two_systems_side_by_side(results):
    figure = ev.routing_figure(results)
    titles = [ax.get_title() for ax in figure.axes]
    assert "conductor" in titles and "warm-start" in titles
    only_conductor = ev.routing_figure(results[results["system"] != "warm-start"])
    assert [ax.get_title() for ax in only_conductor.axes if ax.get_title()] == ["conductor"]


def test_shape_shares_per_conductor_system(results):
    shares = ev.shape_shares(results).set_index("system")
    assert list(shares.index) == ["conductor", "warm-start", "base-policy"]
    assert shares.loc["warm-start", "single"] == 100.0
    assert shares.loc["base-policy", "(no workflow)"] > 0  # the fixture's parse failures
    assert (shares.loc["base-policy", "questions"]) == len(DOMAINS) * 4


def test_no_conductor_rows_is_a_missing_input(results):
    with pytest.raises(MissingInput):
        ev.routing_figure(results[results["system"].str.startswith("solo:")])


def test_worker_choice_reads_the_workers_column_as_the_evaluation_does():
    """Rows whose ``workers`` is missing (NaN, None), not JSON or not a list add no step;
    the shares come from the rows that hold a JSON list, as in the summary's usage shares."""
    results = pd.DataFrame(
        {
            "system": ["conductor"] * 6,
            "domain": ["math", "math", "math", "code", "code", "code"],
            "workers": [
                '["sim-sage", "sim-abacus"]',
                '["sim-sage"]',
                float("nan"),
                None,
                "not json",
                '{"sim-sage": 1}',
            ],
        }
    )
    shares = ev.worker_choice(results)
    assert list(shares.index) == ["math"]
    assert shares.loc["math"].to_dict() == pytest.approx({"sim-abacus": 1 / 3, "sim-sage": 2 / 3})
