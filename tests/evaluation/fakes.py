"""A deterministic fake pool and a scripted Conductor for the evaluation tests."""

from __future__ import annotations

from collections import Counter

from conductor_pipeline.evaluation import PoolView
from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.types import FailureKind, Usage, WorkerReply
from conductor_pipeline.workflow import PolicyCompletion


def make_tasks(per_domain: int = 4, split: str = "test") -> list[Task]:
    tasks = []
    for domain, base in (("math", 100), ("logic", 200)):
        for k in range(per_domain):
            n = base + k
            tasks.append(
                Task(
                    id=f"{split}/{domain}/{k}",
                    domain=domain,
                    difficulty="easy",
                    question=f"[{split} {domain} {k}] What is {n} plus {n}? Give the number.",
                    answer=str(2 * n),
                    answer_format="number",
                    verifier="numeric",
                    source="unit",
                )
            )
    return tasks


class FakePool:
    """Workers that answer from a skill table, deterministically.

    ``skills[name]`` is the set of domains the worker gets right; every other answer is off
    by one. ``fail_every``: the worker's n-th call (1-based) fails when n is a multiple.
    Wrong answers of sample ``i > 0`` differ by sample, right ones never do.
    """

    def __init__(self, tasks, skills=None, prices=None, fail=None):
        self.tasks = list(tasks)
        self.skills = skills or {"ace": {"math", "logic"}, "mathy": {"math"}, "dud": set()}
        self.names = list(self.skills)
        self.prices = prices or {"ace": (1e-5, 4e-5), "mathy": (1e-6, 4e-6), "dud": (1e-7, 4e-7)}
        self.fail = fail or {}
        self.calls: Counter = Counter()
        self.messages: list[tuple[str, str]] = []

    def _task(self, text: str) -> Task | None:
        for task in self.tasks:
            if task.question in text:
                return task
        return None

    async def __call__(self, worker, messages, sample_index=0, **overrides):
        name = self.names[worker]
        self.calls[name] += 1
        text = "\n".join(m["content"] for m in messages)
        self.messages.append((name, text))
        every = self.fail.get(name)
        if every and self.calls[name] % every == 0:
            return WorkerReply(
                name, None, Usage(latency_s=0.001), failure=FailureKind.TIMEOUT, error="timed out"
            )
        task = self._task(text)
        if task is None:
            answer = "0"
        elif task.domain in self.skills[name]:
            answer = task.answer
        else:
            answer = str(int(task.answer) + 1 + sample_index)
        words = len(text.split())
        usage = Usage(
            prompt_tokens=words,
            completion_tokens=10,
            cost_usd=words * self.prices[name][0] + 10 * self.prices[name][1],
            latency_s=0.001,
        )
        return WorkerReply(name, f"Working... The answer is {answer}.", usage)

    def view(self) -> PoolView:
        return PoolView(
            self,
            list(self.names),
            [f"worker {n}" for n in self.names],
            [self.prices[n] for n in self.names],
        )


class ScriptedConductor:
    """Routes maths to worker ``math_worker`` and the rest to ``other_worker``, one step with
    the question in the subtask; keeps the answer in recursion rounds. ``bad`` question
    fragments get unparseable text."""

    name = "scripted"

    def __init__(self, math_worker=1, other_worker=0, bad=(), two_steps=False):
        self.math_worker, self.other_worker, self.bad, self.two_steps = (
            math_worker,
            other_worker,
            tuple(bad),
            two_steps,
        )
        self.calls = 0

    async def complete(self, messages, *, temperature, max_tokens, seed):
        self.calls += 1
        last = messages[-1]["content"]
        if "three empty lists" in last:
            return PolicyCompletion("model_id = []\nsubtasks = []\naccess_list = []", 50, 10, 0.0)
        question = last.rsplit("Question: ", 1)[-1]
        if any(b in question for b in self.bad):
            return PolicyCompletion("I am not sure what to do.", 50, 8, 0.0)
        worker = self.math_worker if "math" in question else self.other_worker
        subtask = question.replace("'", "")
        if self.two_steps:
            text = (
                f"model_id = [{worker}, 0]\nsubtasks = ['{subtask}', 'Check the attempt: {subtask}']\n"
                'access_list = [[], "all"]'
            )
        else:
            text = f"model_id = [{worker}]\nsubtasks = ['{subtask}']\naccess_list = [[]]"
        return PolicyCompletion(text, 50, 20, 0.0)
