"""A real MLflow store holds the trace of an orchestrated question, a span per call and step."""

from __future__ import annotations

import asyncio

import mlflow

from conductor_pipeline.tracing import log_orchestration_trace
from conductor_pipeline.workers.types import FailureKind, Usage, WorkerReply
from conductor_pipeline.workflow import PolicyCompletion, orchestrate


class Policy:
    name = "scripted"

    def __init__(self, *texts):
        self.texts = list(texts)

    async def complete(self, messages, *, temperature, max_tokens, seed):
        return PolicyCompletion(self.texts.pop(0), 80, 30, 0.01)


async def pool(worker, messages, sample_index=0):
    if worker == 1:
        return WorkerReply(
            "w1", None, Usage(latency_s=0.01), failure=FailureKind.TIMEOUT, error="timed out"
        )
    return WorkerReply(
        f"w{worker}", "42", Usage(prompt_tokens=10, completion_tokens=5, cost_usd=0.002)
    )


def test_trace_has_conductor_round_and_step_spans(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("traces", artifact_location=str(tmp_path / "artifacts"))
    workflow = "model_id = [0, 1, 0]\nsubtasks = ['solve', 'solve too', 'compare']\naccess_list = [[], [], \"all\"]"
    result = asyncio.run(
        orchestrate(
            "6*7?",
            Policy("not a workflow", workflow),
            pool,
            ["a", "b"],
            worker_names=["alpha", "beta"],
        )
    )

    trace_id = log_orchestration_trace(
        result, experiment_id=experiment, tags={"system": "conductor"}
    )
    trace = mlflow.get_trace(trace_id, flush=True)

    spans = {span.name: span for span in trace.data.spans}
    assert {
        "conductor",
        "conductor round 0 sample 0",
        "conductor round 0 sample 1",
        "workflow round 0",
    } <= set(spans)
    assert spans["conductor round 0 sample 0"].attributes["parse_error"]
    step_spans = [s for s in trace.data.spans if s.name.startswith("step ")]
    assert [s.name for s in step_spans] == ["step 0: alpha", "step 1: beta", "step 2: alpha"]
    assert step_spans[1].attributes["failure"] == "timeout"
    assert step_spans[0].attributes["cost_usd"] == 0.002
    root = spans["conductor"]
    assert root.attributes["worker_calls"] == 3
    assert trace.info.tags["system"] == "conductor"
