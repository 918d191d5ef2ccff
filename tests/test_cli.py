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
        cli.main(["ask", QUESTION, "--adapter", "none"])


def _scripted(monkeypatch, question: str) -> list[dict]:
    """Replace the policy with a one-step workflow; returns the build_policy calls."""
    calls: list[dict] = []

    def build(*args, **kwargs):
        calls.append(kwargs)
        return ScriptedPolicy(f"model_id = [1]\nsubtasks = ['{question}']\naccess_list = [[]]")

    monkeypatch.setattr("conductor_pipeline.workflow.config.build_policy", build)
    return calls


def test_the_policy_loads_while_the_pool_starts_and_its_failure_stops_the_ask(project, monkeypatch):
    class Policy(ScriptedPolicy):
        def load(self) -> None:
            loaded.append(True)
            if failing:
                raise OSError("adapter_model.safetensors: truncated file")

    loaded: list[bool] = []
    failing = False
    text = f"model_id = [1]\nsubtasks = ['{QUESTION}']\naccess_list = [[]]"
    monkeypatch.setattr(
        "conductor_pipeline.workflow.config.build_policy", lambda *a, **k: Policy(text)
    )
    assert cli.main(["ask", QUESTION, "--json"]) == 0 and loaded == [True]
    failing = True
    with pytest.raises(OSError, match="truncated file"):
        cli.main(["ask", QUESTION, "--json"])


def test_an_unknown_question_gets_a_notice_on_stderr(project, monkeypatch, capsys):
    question = "What is 9 * 8?"
    _scripted(monkeypatch, question)
    assert cli.main(["ask", question]) == 0
    captured = capsys.readouterr()
    assert "not one of the sandbox's prepared tasks" in captured.err
    assert "conductor ask --sample" in captured.err
    assert 'docs/sandbox.md, "Adding a real provider"' in captured.err
    assert "made up" in captured.err
    assert "Answer:" in captured.out and "prepared tasks" not in captured.out

    assert cli.main(["ask", question, "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)  # stdout stays pure JSON
    assert record["simulated"] is True and record["sandbox_known_question"] is False
    assert "conductor ask --sample" in record["warning"]
    assert "prepared tasks" in captured.err


def test_a_prepared_question_gets_no_notice_but_is_marked_simulated(project, monkeypatch, capsys):
    """sim-abacus answered: the answer is known to the sandbox, yet no real model's."""
    _scripted(monkeypatch, QUESTION)
    assert cli.main(["ask", QUESTION, "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["workflow"][0]["worker_name"] == "sim-abacus"
    assert record["simulated"] is True and record["sandbox_known_question"] is True
    assert record["warning"] is None
    assert "prepared tasks" not in captured.err and "made up" not in captured.err


def test_a_cached_step_costs_its_list_price_and_says_cached(project, monkeypatch, capsys):
    """The second ask is served from the response cache: evaluation's list price, marked."""
    from conductor_pipeline.workers.sandbox import load_profiles

    _scripted(monkeypatch, QUESTION)
    assert cli.main(["ask", QUESTION, "--json"]) == 0
    (fresh,) = json.loads(capsys.readouterr().out)["workflow"]
    assert cli.main(["ask", QUESTION, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    (cached,) = record["workflow"]
    assert fresh["cache_hit"] is False and cached["cache_hit"] is True
    profile = next(
        p
        for p in load_profiles(project / "conf/base/sandbox_workers.yml").simulated
        if p.name == "sim-abacus"
    )
    list_price = (
        cached["prompt_tokens"] * profile.input_cost_per_token
        + cached["completion_tokens"] * profile.output_cost_per_token
    )
    assert list_price > 0
    assert cached["cost_usd"] == pytest.approx(list_price)
    assert cached["cost_usd"] == pytest.approx(fresh["cost_usd"])
    assert record["cost_usd"] == pytest.approx(list_price)

    assert cli.main(["ask", QUESTION]) == 0
    out = capsys.readouterr().out
    assert f"${list_price:.6f} (cached, list price)" in out
    assert "(1 cached, at list price)" in out and "$0.000000" not in out


def _register_nothing(project: Path) -> None:
    """The shipped default: the Conductor is models:/conductor@champion, and the test's own
    MLflow store (tests/conftest.py) holds no registered model."""
    path = project / "conf" / "local" / "parameters_conductor.yml"
    params = yaml.safe_load(path.read_text())
    params["conductor"]["policy"]["adapter"] = "models:/conductor@champion"
    path.write_text(yaml.safe_dump(params))


def test_ask_without_a_champion_fails_fast_with_the_fix(project, monkeypatch, capsys):
    _register_nothing(project)
    calls = _scripted(monkeypatch, QUESTION)
    monkeypatch.setattr(
        "conductor_pipeline.workers.runtime.open_worker_pool",
        lambda *a, **k: pytest.fail("no pool may start without a Conductor"),
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ask", QUESTION])
    message = str(exit_info.value.code)
    assert "no trained Conductor" in message and "models:/conductor@champion" in message
    assert "`make run`" in message and "--adapter <folder|models:/conductor/N>" in message
    assert "--adapter none" in message
    assert calls == []  # nor is the base policy built


def test_an_explicit_adapter_must_resolve(project, monkeypatch):
    _scripted(monkeypatch, QUESTION)
    with pytest.raises(SystemExit, match="models:/conductor/7 does not resolve"):
        cli.main(["ask", QUESTION, "--adapter", "models:/conductor/7"])
    with pytest.raises(SystemExit, match="no adapter_config.json"):
        cli.main(["ask", QUESTION, "--adapter", str(project)])


def test_adapter_none_asks_the_base_policy_on_purpose(project, monkeypatch, capsys):
    _register_nothing(project)
    calls = _scripted(monkeypatch, QUESTION)
    assert cli.main(["ask", QUESTION, "--adapter", "none"]) == 0
    assert calls == [{"adapter_dir": None}]
    assert "Answer:" in capsys.readouterr().out


def test_an_adapter_folder_is_passed_to_the_policy(project, monkeypatch):
    adapter = project / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    calls = _scripted(monkeypatch, QUESTION)
    # a config without weights would fail deep inside PEFT's loading: refused by name first
    with pytest.raises(SystemExit, match="adapter_config.json but no weights there"):
        cli.main(["ask", QUESTION, "--adapter", str(adapter), "--json"])
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    assert cli.main(["ask", QUESTION, "--adapter", str(adapter), "--json"]) == 0
    assert calls == [{"adapter_dir": str(adapter)}]


def test_conductor_ask_without_a_champion_exits_quickly(project, tmp_path):
    """The real command in a fresh process: non-zero, the fix on stderr, in seconds (it
    used to sample the untrained policy for minutes), and nothing on stdout, run as with
    only the virtual environment activated (none of the Makefile's logging variables)."""
    import os
    import subprocess
    import sys
    import time

    _register_nothing(project)
    unset = ("CONDUCTOR_PROJECT_ROOT", "KEDRO_LOGGING_CONFIG", "KEDRO_LOGGING_MODULE_ALLOWLIST")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'empty-mlflow.db'}"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "conductor_pipeline.cli", "ask", "What is 17 * 23?"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    # stdout is the answer's or the --json record's alone: Kedro's default logging printed
    # "Using '.../rich_logging.yml' as logging configuration" there
    assert done.stdout == ""
    assert "no trained Conductor" in done.stderr and "make run" in done.stderr
    assert "Traceback" not in done.stderr
    assert elapsed < 60, elapsed  # start-up and an MLflow lookup; no sandbox, no sampling


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
