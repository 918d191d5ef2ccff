"""`conductor ask`: the sandbox starts by itself and --json follows the DESIGN.md contract."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conductor_pipeline import cli
from conductor_pipeline.tasks import Task
from conductor_pipeline.workflow import PolicyCompletion

REPO = Path(__file__).resolve().parents[1]
QUESTION = "Compute the sum of 1234 and 4321 and give the number."


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "project"
    (root / "conf" / "local").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf" / "base", root / "conf" / "base")
    splits = root / "data" / "05_model_input"
    splits.mkdir(parents=True)
    for i, name in enumerate(("test", "train", "validation")):
        question = (
            QUESTION
            if name == "test"
            else f"Compute the sum of {i} and {i + 10} and give the number."
        )
        task = Task(f"t/{name}", "math", "easy", question, "5555", "number", "numeric", "unit")
        pd.DataFrame([task.to_record()]).to_parquet(splits / f"{name}_tasks.parquet")
    pool = yaml.safe_load((REPO / "conf/base/workers.yml").read_text())
    pool["worker_pool"]["sandbox"].update(
        load_real_model=False, latency_scale=0.0, workers=["sim-sage", "sim-abacus"]
    )
    (root / "conf" / "local" / "workers.yml").write_text(yaml.safe_dump(pool))
    params = yaml.safe_load((REPO / "conf/base/parameters_conductor.yml").read_text())
    params["conductor"]["policy"]["adapter"] = None  # nothing is registered in a fresh project
    (root / "conf" / "local" / "parameters_conductor.yml").write_text(yaml.safe_dump(params))
    monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT", raising=False)
    monkeypatch.chdir(root)
    return root


class ScriptedPolicy:
    name = "scripted"

    def __init__(self, text: str):
        self.text = text

    async def complete(self, messages, *, temperature, max_tokens, seed):
        return PolicyCompletion(self.text, 50, 20, 0.0)


def test_ask_json_follows_the_contract(project, monkeypatch, capsys):
    completion = f"model_id = [1, 0]\nsubtasks = ['{QUESTION}', 'Check the sum above.']\naccess_list = [[], \"all\"]"
    monkeypatch.setattr(
        "conductor_pipeline.workflow.config.build_policy",
        lambda *a, **k: ScriptedPolicy(completion),
    )

    assert cli.main(["ask", QUESTION, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {"answer", "workflow", "cost_usd", "tokens", "latency_s"} <= set(record)
    assert record["answer"]
    first, second = record["workflow"]
    assert (first["worker_name"], second["worker_name"]) == ("sim-abacus", "sim-sage")
    assert first["access"] == [] and second["access"] == [0]
    for step in record["workflow"]:
        assert {"worker_name", "subtask", "access", "cost_usd", "latency_s", "error"} <= set(step)
        assert step["prompt_tokens"] + step["completion_tokens"] > 0
    assert record["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in record["workflow"]))


def test_ask_without_prepared_data_says_what_to_run(project, capsys):
    for path in (project / "data" / "05_model_input").iterdir():
        path.unlink()
    with pytest.raises(FileNotFoundError, match="make run"):
        cli.main(["ask", QUESTION, "--adapter", str(project)])


@pytest.mark.slow
def test_ask_with_the_real_untrained_smollm2_conductor(project, capsys):
    """The whole path with a real policy: the output may or may not parse, either is reported."""
    params = yaml.safe_load((project / "conf/local/parameters_conductor.yml").read_text())
    params["conductor"].update(max_parse_attempts=1)
    params["conductor"]["sampling"]["max_tokens"] = 48
    (project / "conf" / "local" / "parameters_conductor.yml").write_text(yaml.safe_dump(params))
    code = cli.main(["ask", "--sample", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert code == (2 if record["format_failure"] else 0)
    assert len(record["conductor_calls"]) >= 1
    assert record["conductor_calls"][0]["completion_tokens"] > 0


def test_ask_prints_the_workflow_as_it_runs(project, monkeypatch, capsys):
    completion = f"model_id = [1]\nsubtasks = ['{QUESTION}']\naccess_list = [[]]"
    monkeypatch.setattr(
        "conductor_pipeline.workflow.config.build_policy",
        lambda *a, **k: ScriptedPolicy(completion),
    )
    assert cli.main(["ask", QUESTION]) == 0
    out = capsys.readouterr().out
    assert out.index("step 0: worker 1") < out.index("running on sim-abacus") < out.index("Answer:")
    assert "Total: 1 worker calls" in out
