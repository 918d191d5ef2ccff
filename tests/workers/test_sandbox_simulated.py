"""Unit tests of the sandbox's simulated workers, profiles and in-process app (no subprocess)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml

from conductor_pipeline.tasks.types import Task
from conductor_pipeline.workers.sandbox.profiles import (
    ProfileError,
    SimulatedProfile,
    default_profiles_path,
    load_profiles,
    parse_profiles,
    sandbox_pool_config,
)
from conductor_pipeline.workers.sandbox.simulated import (
    SimulatedWorker,
    TaskIndex,
    break_code,
    extract_attempts,
    is_correct,
    render_answer,
    wrong_answer,
)

PROFILES_PATH = default_profiles_path()

CODE_ANSWER = "def add_one(values):\n    return [v + 1 for v in values]\n"


def _tasks() -> list[Task]:
    return [
        Task(
            id="num-1",
            domain="math",
            difficulty="medium",
            question=(
                "A baker fills 17 trays with 23 rolls each and then sells 45 rolls before "
                "lunch. How many rolls are left?"
            ),
            answer="346",
            answer_format="number",
            verifier="numeric",
            source="hand",
        ),
        Task(
            id="math-1",
            domain="math",
            difficulty="hard",
            question="Simplify the ratio of the area of a circle of radius 3 to its circumference, in lowest terms.",
            answer="\\frac{3}{2}",
            answer_format="math",
            verifier="math",
            source="hand",
        ),
        Task(
            id="mc-1",
            domain="logic",
            difficulty="easy",
            question=(
                "Every knight tells the truth and every knave lies. Ann says Bob is a knave. "
                "Bob says both of them are knights. Which is true? (A) both knights "
                "(B) Ann knight, Bob knave (C) Ann knave, Bob knight (D) both knaves (E) undecidable"
            ),
            answer="B",
            answer_format="letter",
            verifier="multiple_choice",
            source="hand",
            metadata={"choices": ["a", "b", "c", "d", "e"]},
        ),
        Task(
            id="txt-1",
            domain="algorithmic",
            difficulty="easy",
            question=(
                "Sort the following words alphabetically and give them separated by commas: "
                "pear, apple, fig, banana."
            ),
            answer="apple, banana, fig, pear",
            answer_format="text",
            verifier="reasoning_gym",
            source="hand",
        ),
        Task(
            id="code-1",
            domain="code",
            difficulty="medium",
            question=(
                "Write a Python function add_one(values) that takes a list of integers and "
                "returns a new list with every element increased by one."
            ),
            answer=CODE_ANSWER,
            answer_format="code",
            verifier="code",
            source="hand",
        ),
    ]


TASKS = _tasks()
BY_ID = {t.id: t for t in TASKS}


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(PROFILES_PATH)


@pytest.fixture(scope="module")
def index() -> TaskIndex:
    return TaskIndex(TASKS)


def _profile(profiles, name: str) -> SimulatedProfile:
    found = profiles.get(name)
    assert isinstance(found, SimulatedProfile)
    return found


def _fixed(profile: SimulatedProfile, *, skill: float, verify: float = 0.0, guess: float = 0.0):
    """A copy of ``profile`` with the same skill everywhere (for statistical tests)."""
    return replace(
        profile,
        skill={"default": {"default": skill}},
        verify_skill=verify,
        guess_rate=guess,
        mean_words=10,
    )


def _ask(text: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are one worker in a team."},
        {"role": "user", "content": text},
    ]


# --- profiles -----------------------------------------------------------------------------


def test_profile_file_shape(profiles):
    sims = profiles.simulated
    assert len(sims) >= 4 and all(p.name.startswith("sim-") for p in sims)
    assert [p.name for p in profiles.real] == ["smollm2-135m"]
    domains = ("math", "logic", "algorithmic", "code")
    for domain in domains:
        # no worker is best in every domain: each domain's best differs for some pair
        best = max(sims, key=lambda p: p.skill_for(domain, "medium"))
        assert best.skill_for(domain, "medium") > 0.8
    bests = {max(sims, key=lambda p: p.skill_for(d, "hard")).name for d in domains}
    assert len(bests) >= 2
    mean = {p.name: sum(p.skill_for(d, "medium") for d in domains) / 4 for p in sims}
    strongest = max(mean, key=mean.get)
    price = {p.name: p.input_cost_per_token + p.output_cost_per_token for p in sims}
    assert strongest == max(price, key=price.get)
    assert 10 <= price[strongest] / min(price.values()) <= 20


def test_skill_lookup_falls_back(profiles):
    sage = _profile(profiles, "sim-sage")
    assert sage.skill_for("unheard-of", "hard") == sage.skill["default"]["hard"]
    table = sage.skill["math"]
    assert sage.skill_for("math", "legendary") == pytest.approx(sum(table.values()) / len(table))


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda d: d["simulated"][1].update(verfy_skill=0.5),
            "simulated[1]: unknown key 'verfy_skill'",
        ),
        (
            lambda d: d["simulated"][0]["skill"]["math"].update(hard=1.5),
            "simulated[0].skill.math.hard",
        ),
        (lambda d: d["simulated"][2].pop("guess_rate"), "simulated[2].guess_rate"),
        (lambda d: d["simulated"][2].update(call_variation=2), "simulated[2].call_variation"),
        (lambda d: d["simulated"][0].update(name="oracle"), "simulated[0].name"),
        (
            lambda d: d["simulated"][0]["latency"].update(median="1"),
            "simulated[0].latency: unknown key 'median'",
        ),
        (lambda d: d["real"][0].update(max_tokens=0), "real[0].max_tokens"),
        (lambda d: d["simulated"][1].update(name="sim-sage"), "declared twice"),
    ],
)
def test_bad_profiles_name_the_key(edit, needle):
    data = yaml.safe_load(PROFILES_PATH.read_text())
    edit(data)
    with pytest.raises(ProfileError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_profiles(data)


def test_pool_config_entries(profiles):
    entries = sandbox_pool_config(profiles, "http://127.0.0.1:9999/v1/")
    assert [e["name"] for e in entries] == profiles.names
    first = entries[0]
    assert first["model"] == "openai/sim-sage"
    assert first["api_base"] == "http://127.0.0.1:9999/v1"
    assert first["input_cost_per_token"] == profiles.simulated[0].input_cost_per_token
    assert first["timeout_s"] > 0 and first["description"]
    assert entries[-1]["max_tokens"] == profiles.real[0].max_tokens
    # the pool's own loader accepts them as they are, when it exists
    config = pytest.importorskip("conductor_pipeline.workers.config")
    specs = config.load_worker_specs({"workers": entries}, environ={})
    assert [s.name for s in specs] == profiles.names


# --- recognising tasks --------------------------------------------------------------------


@pytest.mark.parametrize(
    "questions",
    [
        # short questions, matched whole: the signs tell them apart
        ["Calculate 5 + 1.", "Calculate -5 + 1.", "Calculate 5 * 1.", "Calculate -( 5 + 1 )."],
        # long questions, matched by 6-grams: the same words, other brackets
        [
            f"Return True when every opening bracket in brackets has a closing one. {pair}"
            " Examples follow below for the reader."
            for pair in ('"<" and ">"', '"(" and ")"')
        ],
    ],
)
def test_index_tells_apart_questions_that_differ_only_in_signs(questions):
    tasks = [
        Task(f"q{i}", "math", "easy", q, str(i), "number", "numeric", "hand")
        for i, q in enumerate(questions)
    ]
    index = TaskIndex(tasks)
    for task in tasks:
        assert index.scan(f"Please solve: {task.question}")[0].task.id == task.id


def test_index_finds_a_visible_question_inside_other_text(index):
    task = BY_ID["num-1"]
    text = f"<overall>Help the team.</overall>\n<subtask>{task.question.upper()}</subtask> thanks"
    assert [t.id for t in index.visible(text)] == ["num-1"]
    assert index.scan(text)[0].coverage == 1.0


def test_index_threshold_and_partial_recognition(index):
    words = BY_ID["code-1"].question.split()
    half = " ".join(words[: len(words) // 2])
    assert index.visible(half) == []
    partial = index.scan(half)
    assert partial and partial[0].task.id == "code-1" and 0.2 <= partial[0].coverage < 0.6
    most = " ".join(words[: int(len(words) * 0.85)])
    assert [t.id for t in index.visible(most)] == ["code-1"]
    assert index.scan("What is the capital of France?") == []


def test_index_short_questions_match_whole():
    short = Task(
        id="s",
        domain="math",
        difficulty="easy",
        question="What is 2+2?",
        answer="4",
        answer_format="number",
        verifier="numeric",
        source="hand",
    )
    idx = TaskIndex([short])
    assert [t.id for t in idx.visible("please: what is 2 + 2 ?")] == ["s"]
    assert idx.visible("what is 2") == []


def test_index_is_fast_enough_for_the_full_task_set():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(3000)]
    tasks = [
        Task(
            id=f"t{i}",
            domain="math",
            difficulty="easy",
            question="Answer the question below with a single number. "
            + " ".join(rng.choice(vocab) for _ in range(60)),
            answer="1",
            answer_format="number",
            verifier="numeric",
            source="gen",
        )
        for i in range(2000)
    ]
    import time

    idx = TaskIndex(tasks)
    text = " ".join(rng.choice(vocab) for _ in range(300)) + " " + tasks[777].question
    started = time.perf_counter()
    for _ in range(50):
        found = idx.visible(text)
    per_call = (time.perf_counter() - started) / 50
    assert found[0].id == "t777"
    assert per_call < 0.02


# --- determinism --------------------------------------------------------------------------


def test_same_request_same_reply(profiles, index):
    worker = SimulatedWorker(_profile(profiles, "sim-abacus"), index, base_seed=3)
    messages = _ask(BY_ID["num-1"].question)
    first = worker.reply(messages, seed=11, temperature=0.7)
    again = SimulatedWorker(_profile(profiles, "sim-abacus"), TaskIndex(TASKS), base_seed=3)
    assert again.reply(messages, seed=11, temperature=0.7) == first
    text, prompt_tokens, completion_tokens, latency = first
    assert text and prompt_tokens > 20 and completion_tokens > 10 and latency > 0


def test_different_seeds_give_different_replies(profiles, index):
    worker = SimulatedWorker(_profile(profiles, "sim-sprout"), index)
    messages = _ask(BY_ID["num-1"].question)
    replies = {worker.reply(messages, seed=s, temperature=0.7)[0] for s in range(20)}
    assert len(replies) >= 15
    other_server = SimulatedWorker(_profile(profiles, "sim-sprout"), index, base_seed=1)
    assert (
        sum(
            other_server.reply(messages, seed=s, temperature=0.7)[0]
            != worker.reply(messages, seed=s, temperature=0.7)[0]
            for s in range(20)
        )
        >= 15
    )


# --- accuracy follows the profile ---------------------------------------------------------

N = 300


def _servers(profile: SimulatedProfile, index: TaskIndex, n: int = N) -> list[SimulatedWorker]:
    """The same worker on ``n`` sandbox servers of different seeds: its luck on a task is
    fixed per server, so rates are measured across servers."""
    return [SimulatedWorker(profile, index, base_seed=s) for s in range(n)]


def _replies(profile: SimulatedProfile, index: TaskIndex, messages, n: int = N) -> list:
    return [w.respond(messages, seed=7, temperature=0.5) for w in _servers(profile, index, n)]


def _accuracy(profile: SimulatedProfile, index: TaskIndex, messages) -> float:
    return sum(bool(r.correct) for r in _replies(profile, index, messages)) / N


def _tolerance(p: float) -> float:
    return 4 * math.sqrt(p * (1 - p) / N) + 0.01


def test_visible_question_solved_at_skill(profiles, index):
    for task_id, skill in (("num-1", 0.7), ("txt-1", 0.35), ("code-1", 0.9)):
        profile = _fixed(_profile(profiles, "sim-coder"), skill=skill)
        acc = _accuracy(profile, index, _ask(BY_ID[task_id].question))
        assert abs(acc - skill) <= _tolerance(skill), (task_id, acc)


def test_hidden_question_right_only_at_guess_rate(profiles, index):
    profile = _fixed(_profile(profiles, "sim-sage"), skill=0.95, guess=0.1)
    worker = SimulatedWorker(profile, index)
    words = BY_ID["num-1"].question.split()
    garbled = _ask("Please help: " + " ".join(words[: len(words) // 2 + 2]))
    replies = _replies(profile, index, garbled)
    assert {r.mode for r in replies} == {"garbled"}
    acc = sum(bool(r.correct) for r in replies) / N
    assert abs(acc - 0.1) <= _tolerance(0.1)
    # multiple choice: a random letter among the five options
    words = BY_ID["mc-1"].question.split()
    garbled_mc = _ask(" ".join(words[:18]))
    letters = _replies(profile, index, garbled_mc)
    acc = sum(bool(r.correct) for r in letters) / N
    assert abs(acc - 0.2) <= _tolerance(0.2)
    assert {r.text.rsplit("(", 1)[1][0] for r in letters} == set("ABCDE")
    # nothing recognisable: never right, still an answer
    nothing = worker.respond(_ask("Tell me something interesting about rivers."), seed=1)
    assert nothing.mode == "confused" and nothing.correct is None and "\\boxed{" in nothing.text


def test_adopts_a_correct_earlier_attempt_per_verify_skill(profiles, index):
    task = BY_ID["num-1"]
    context = (
        f"<task>{task.question}</task>\n<step 0 response>I multiplied and subtracted. "
        f"The answer is 346.</step 0 response>\n<subtask>Check the answer above.</subtask>"
    )
    profile = _fixed(_profile(profiles, "sim-sprout"), skill=0.2, verify=0.6)
    acc = _accuracy(profile, index, _ask(context))
    expected = 0.2 + 0.8 * 0.6
    assert abs(acc - expected) <= _tolerance(expected)
    modes = {r.mode for r in _replies(profile, index, _ask(context), 60)}
    assert {"confirm", "adopt"} <= modes


def test_wrong_earlier_attempt_is_sometimes_copied(profiles, index):
    task = BY_ID["num-1"]
    context = f"{task.question}\nPrevious worker: the answer is 999.\nNow verify it."
    profile = _fixed(_profile(profiles, "sim-sprout"), skill=0.3, verify=0.5)
    replies = _replies(profile, index, _ask(context))
    acc = sum(bool(r.correct) for r in replies) / N
    assert abs(acc - 0.3) <= _tolerance(0.3)
    copied = [r for r in replies if r.mode == "copy"]
    assert copied and all("\\boxed{999}" in r.text for r in copied)
    assert {"fix", "copy", "wrong"} <= {r.mode for r in replies}


# --- a worker's luck on a task is fixed ---------------------------------------------------


def _check_of(task: Task, attempt: str) -> list[dict[str, str]]:
    return _ask(
        f'<question>{task.question}</question>\n<response step="0">{attempt}</response>\n'
        "Your subtask: check the answer above and give the final answer."
    )


def test_asking_again_gives_no_new_chance(profiles, index):
    profile = _fixed(_profile(profiles, "sim-sprout"), skill=0.5)
    for task in TASKS:
        for worker in _servers(profile, index, 20):
            replies = [
                worker.respond(_ask(task.question), seed=seed, temperature=temperature)
                for seed in range(6)
                for temperature in (0.2, 1.0)
            ]
            assert len({r.correct for r in replies}) == 1, task.id
            # a failing worker gives the same wrong answer every time
            finals = {tuple(extract_attempts(r.text, task.answer_format)) for r in replies}
            assert len(finals) == 1 or replies[0].correct, task.id


def test_checking_its_own_answer_changes_nothing(profiles, index):
    """ "Solve, then the same worker checks" scores exactly what the worker scores alone,
    server by server, while a different worker's check pays."""
    task = BY_ID["num-1"]
    solver = _fixed(_profile(profiles, "sim-abacus"), skill=0.5, verify=0.9)
    checker = replace(
        _fixed(_profile(profiles, "sim-sage"), skill=0.5, verify=0.9), name="sim-checker"
    )
    alone = self_checked = other_checked = 0
    for seed in range(N):
        first = SimulatedWorker(solver, index, base_seed=seed).respond(_ask(task.question))
        again = SimulatedWorker(solver, index, base_seed=seed).respond(
            _check_of(task, first.text), seed=1
        )
        other = SimulatedWorker(checker, index, base_seed=seed).respond(
            _check_of(task, first.text), seed=1
        )
        assert again.correct == first.correct
        alone += first.correct
        self_checked += again.correct
        other_checked += other.correct
    assert alone == self_checked
    expected = 0.5 + 0.5 * 0.5 * 0.9  # the checker solves it, or spots the right attempt
    assert abs(other_checked / N - expected) <= _tolerance(expected)


def test_call_variation_draws_fresh_luck_per_call(profiles, index):
    profile = replace(_fixed(_profile(profiles, "sim-sprout"), skill=0.5), call_variation=1.0)
    worker = SimulatedWorker(profile, index, base_seed=3)
    messages = _ask(BY_ID["num-1"].question)
    replies = [worker.respond(messages, seed=s) for s in range(N)]
    acc = sum(bool(r.correct) for r in replies) / N
    assert abs(acc - 0.5) <= _tolerance(0.5)
    fixed = SimulatedWorker(replace(profile, call_variation=0.0), index, base_seed=3)
    assert len({fixed.respond(messages, seed=s).correct for s in range(40)}) == 1


def test_sandbox_workers_have_fixed_luck(profiles):
    assert all(p.call_variation == 0.0 for p in profiles.simulated)


# --- reply formats ------------------------------------------------------------------------


def test_reply_formats(profiles, index):
    solver = SimulatedWorker(_fixed(_profile(profiles, "sim-sage"), skill=1.0), index)
    failer = SimulatedWorker(_fixed(_profile(profiles, "sim-sage"), skill=0.0), index)
    expectations = {
        "num-1": ("The answer is 346.", "\\boxed{346}"),
        "math-1": ("\\boxed{\\frac{3}{2}}",),
        "mc-1": ("Answer: (B)",),
        "txt-1": ("<answer>apple, banana, fig, pear</answer>",),
        "code-1": ("```python\n" + CODE_ANSWER.strip() + "\n```",),
    }
    for task_id, needles in expectations.items():
        messages = _ask(BY_ID[task_id].question)
        right = solver.respond(messages, seed=5)
        assert right.correct is True and right.mode == "solve"
        for needle in needles:
            assert needle in right.text
        wrong = failer.respond(messages, seed=5)
        assert wrong.correct is False
        attempts = extract_attempts(wrong.text, BY_ID[task_id].answer_format)
        assert attempts and not any(is_correct(BY_ID[task_id], a) for a in attempts)


def test_wrong_answers_are_wrong_in_every_format():
    rng = random.Random(0)
    for task in TASKS:
        for _ in range(50):
            bad = wrong_answer(task, rng)
            assert not is_correct(task, bad), (task.id, bad)
    mc = BY_ID["mc-1"]
    assert {wrong_answer(mc, rng) for _ in range(200)} == set("ACDE")


def test_broken_code_fails_its_tests():
    rng = random.Random(1)
    namespace: dict = {}
    exec(CODE_ANSWER, namespace)  # the reference passes
    assert namespace["add_one"]([1, 2]) == [2, 3]
    for _ in range(10):
        broken = break_code(CODE_ANSWER, rng)
        scope: dict = {}
        try:
            exec(broken, scope)
            result = scope["add_one"]([1, 2])
        except Exception:
            continue
        assert result != [2, 3]
    assert "raise" in break_code("x = 1", rng)


def _verifiable_tasks() -> list[Task]:
    """Hand-made tasks plus real reasoning-gym items, all checkable by ``verify``.

    (Text answers are checked through reasoning-gym items only: the ``exact`` verifier does
    not read ``<answer>`` tags.)
    """
    tasks = [t for t in TASKS if t.verifier != "reasoning_gym"]
    code = BY_ID["code-1"]
    tasks[tasks.index(code)] = replace(
        code,
        metadata={
            "entry_point": "add_one",
            "prompt": 'def add_one(values):\n    """Every element plus one."""\n',
            "test": "def check(f):\n    assert f([1, 2]) == [2, 3]\n    assert f([]) == []\n",
        },
    )
    reasoning_gym = pytest.importorskip("reasoning_gym")
    for name in ("knights_knaves", "number_sorting", "family_relationships", "basic_arithmetic"):
        for k, entry in enumerate(reasoning_gym.create_dataset(name, size=3, seed=5)):
            answer = str(entry["answer"])
            tasks.append(
                Task(
                    id=f"rg-{name}-{k}",
                    domain="logic",
                    difficulty="medium",
                    question=entry["question"],
                    answer=answer,
                    answer_format="number" if answer.lstrip("-").isdigit() else "text",
                    verifier="reasoning_gym",
                    source="reasoning_gym",
                    metadata={"dataset": name, "entry": entry},
                )
            )
    # propositional logic as data_prep builds it: its scorer accepts any valid conclusion, so
    # a wrong answer of the simulation must be one the scorer rejects, not only a changed one
    from conductor_pipeline.tasks.sources.reasoning_gym_source import load_reasoning_gym

    spec = {"propositional_logic": {"count": 10, "domain": "logic", "difficulty": "hard"}}
    return tasks + load_reasoning_gym(spec, seed=5)


def test_replies_pass_and_fail_the_project_verifiers(profiles):
    verifiers = pytest.importorskip("conductor_pipeline.tasks.verifiers")
    tasks = _verifiable_tasks()
    index = TaskIndex(tasks)
    solving = _fixed(_profile(profiles, "sim-sage"), skill=1.0)
    failing = _fixed(_profile(profiles, "sim-sage"), skill=0.0)
    for task in tasks:
        messages = _ask(task.question)
        # a worker's wrong answer to a task is fixed per server: several servers, several
        for seed in range(2 if task.answer_format == "code" else 8):
            good = SimulatedWorker(solving, index, base_seed=seed).respond(messages, seed=seed)
            bad = SimulatedWorker(failing, index, base_seed=seed).respond(messages, seed=seed)
            assert good.task_id == bad.task_id == task.id
            verdict = verifiers.verify(task, good.text)
            assert verdict.correct, (task.id, verdict.reason, good.text[-300:])
            verdict = verifiers.verify(task, bad.text)
            assert not verdict.correct, (task.id, verdict.reason, bad.text[-300:])


def test_rendered_answers_are_extracted_back():
    for fmt, value in (("number", "12"), ("math", "\\sqrt{2}"), ("letter", "D"), ("text", "a b")):
        assert value in extract_attempts(render_answer(fmt, value), fmt)


def test_very_verbose_profile_terminates(profiles, index):
    chatty = replace(_profile(profiles, "sim-sphinx"), mean_words=2000)
    reply = SimulatedWorker(chatty, index).respond(_ask(BY_ID["mc-1"].question), seed=0)
    assert reply.completion_tokens > 1000 and "Answer: (" in reply.text


def test_max_tokens_truncates(profiles, index):
    worker = SimulatedWorker(_fixed(_profile(profiles, "sim-sage"), skill=1.0), index)
    reply = worker.respond(_ask(BY_ID["num-1"].question), seed=0, max_tokens=5)
    assert reply.finish_reason == "length" and reply.completion_tokens <= 5
    assert reply.correct is False


# --- the app in-process (no model, no subprocess) -----------------------------------------


@pytest.fixture
async def client(profiles):
    from conductor_pipeline.workers.sandbox.server import create_app

    app = create_app(profiles, TASKS, seed=0, latency_scale=0.0, load_real_model=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as http:
        yield http


async def test_app_health_and_models(client, profiles):
    health = await client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    listing = (await client.get("/v1/models")).json()
    assert listing["object"] == "list"
    owners = {m["id"]: m["owned_by"] for m in listing["data"]}
    assert set(owners) == set(profiles.names)
    assert (
        owners["sim-sage"] == "sandbox-simulated" and owners["smollm2-135m"] != "sandbox-simulated"
    )


async def test_app_chat_completion(client):
    body = {
        "model": "sim-abacus",
        "messages": _ask(BY_ID["num-1"].question),
        "temperature": 0.2,
        "seed": 4,
    }
    first = await client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200
    data = first.json()
    assert data["object"] == "chat.completion" and data["model"] == "sim-abacus"
    assert data["id"].startswith("chatcmpl-")
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert data["choices"][0]["finish_reason"] == "stop"
    again = (await client.post("/v1/chat/completions", json=body)).json()
    assert again["choices"][0]["message"]["content"] == data["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (
            {"model": "sim-sage", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            400,
            "streaming is not supported",
        ),
        (
            {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]},
            404,
            "does not exist",
        ),
        ({"model": "sim-sage"}, 400, "messages"),
        ({"model": "sim-sage", "messages": []}, 400, "messages"),
        ({"model": "sim-sage", "messages": [{"content": "hi"}]}, 400, "role"),
        (
            {
                "model": "sim-sage",
                "messages": [{"role": "user", "content": "x"}],
                "temperature": "hot",
            },
            400,
            "temperature",
        ),
        (
            {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]},
            503,
            "unavailable",
        ),
    ],
)
async def test_app_errors(client, body, status, needle):
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"] and error["type"]


async def test_app_rejects_non_json(client):
    response = await client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]


def test_load_tasks_formats(tmp_path: Path):
    import pandas as pd

    from conductor_pipeline.workers.sandbox.server import load_tasks

    records = [t.to_record() for t in TASKS]
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(__import__("json").dumps(r) for r in records) + "\n")
    parquet = tmp_path / "b.parquet"
    pd.DataFrame(records[:2]).to_parquet(parquet)
    loaded = load_tasks([jsonl, parquet])
    assert [t.id for t in loaded] == [t.id for t in TASKS] + [t.id for t in TASKS[:2]]
    assert loaded[2].metadata == {"choices": ["a", "b", "c", "d", "e"]}
    with pytest.raises(ValueError, match="unsupported"):
        load_tasks([tmp_path / "x.csv"])
