"""Fixtures for the reports: a small evaluation (per-question results and the
tables the evaluation pipeline derives from them), and (from tests/mlflow_store.py) a tiny
MLflow store with a training run's metric history and a registry with a few versions of
``conductor``."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from conductor_pipeline.evaluation import (
    QuestionResult,
    results_frame,
    summarise,
    summarise_by_domain,
)
from tests.mlflow_store import registry, tracking_uri, training_run  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[2]
WORKERS = ["sim-sage", "sim-abacus", "sim-coder", "sim-sprout"]
DOMAINS = ["math", "logic", "code"]


def _conductor_detail(question: str, workers: list[str], answer: str) -> dict:
    steps = [
        {
            "index": i,
            "worker": WORKERS.index(w),
            "worker_name": w,
            "subtask": f"Step {i}: work on the question '{question}'",
            "access": list(range(i)),
            "response": answer if i == len(workers) - 1 else f"draft {i}",
            "cost_usd": 0.0004 * (i + 1),
        }
        for i, w in enumerate(workers)
    ]
    return {"question": question, "answer": answer, "workflow": steps, "worker_names": WORKERS}


def make_results(seed: int = 0, n_per_domain: int = 4, max_steps: int = 3) -> pd.DataFrame:
    """Per-question results of conductor, base-policy, two solo workers and the oracle;
    the workflows have 1 to ``max_steps`` steps."""
    rng = random.Random(seed)
    rows: list[QuestionResult] = []
    for domain in DOMAINS:
        for q in range(n_per_domain):
            qid = f"{domain}/{q}"
            question = f"A {domain} question number {q}?"
            for system, skill in (
                ("conductor", 0.75),
                ("base-policy", 0.2),
                ("solo:sim-sage", 0.7),
                ("solo:sim-sprout", 0.3),
            ):
                correct = rng.random() < skill
                result = QuestionResult(
                    system=system,
                    variant="v",
                    question_id=qid,
                    split="test",
                    domain=domain,
                    difficulty="easy",
                    correct=correct,
                    score=float(correct),
                    answer="42" if correct else "41",
                    extracted="42" if correct else "41",
                    verdict="correct" if correct else "wrong",
                    cost_usd=0.002 if system != "solo:sim-sprout" else 0.0002,
                    tokens=300,
                    calls=1,
                    latency_s=0.4,
                )
                if system in ("conductor", "base-policy"):
                    parse_failure = system == "base-policy" and rng.random() < 0.6
                    result.parse_failure = parse_failure
                    if not parse_failure:
                        chosen = rng.sample(WORKERS, k=rng.randint(1, max_steps))
                        result.workers = chosen
                        result.n_steps = len(chosen)
                        result.calls = len(chosen)
                        result.access_pattern = "single" if len(chosen) == 1 else "chain"
                        result.detail = _conductor_detail(question, chosen, result.answer)
                    else:
                        result.correct = False
                else:
                    result.workers = [system.split(":", 1)[1]]
                rows.append(result)
    oracle = []
    for qid in sorted({r.question_id for r in rows}):
        mine = [r for r in rows if r.question_id == qid and r.system.startswith("solo:")]
        best = QuestionResult(**{**mine[0].to_json(), "system": "oracle"})
        best.correct = any(r.correct for r in mine)
        oracle.append(best)
    return results_frame(rows + oracle)


@pytest.fixture
def evaluation_files(tmp_path) -> dict[str, Path]:
    """The evaluation pipeline's files for the small fixture evaluation of conductor/1."""
    folder = tmp_path / "evaluation"
    folder.mkdir()
    results = make_results()
    paths = {
        "summary": folder / "evaluation_summary.csv",
        "by_domain": folder / "evaluation_summary_by_domain.csv",
        "results": folder / "evaluation_results.parquet",
        "run_info": folder / "evaluation_run_info.json",
    }
    summarise(results, samples=200).to_csv(paths["summary"], index=False)
    summarise_by_domain(results, samples=200).to_csv(paths["by_domain"], index=False)
    results.to_parquet(paths["results"], index=False)
    paths["run_info"].write_text(
        json.dumps(
            {
                "conductor": "models:/conductor/1 (version 1)",
                "conductor_variant": "conductor/1",
                "conductor_is_base_policy": False,
            }
        )
    )
    return paths
