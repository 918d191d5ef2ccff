"""Task sources: reasoning-gym, HumanEval and the paper's benchmarks (on fixture files)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from conductor_pipeline.tasks.sources import (
    BENCHMARK_LOADERS,
    SOURCES,
    load_gpqa_diamond,
    load_humaneval,
    load_livecodebench,
    load_reasoning_gym,
    load_source,
    read_local_rows,
)
from conductor_pipeline.tasks.sources.benchmarks import livecodebench_files
from conductor_pipeline.tasks.types import Task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"

# name -> (domain, verifiers allowed, answer formats allowed, number of tasks from the fixture)
EXPECTED = {
    "math500": ("math", {"math"}, {"math"}, 5),
    "mmlu": ("knowledge", {"multiple_choice"}, {"letter"}, 4),
    "gpqa_diamond": ("science", {"multiple_choice"}, {"letter"}, 3),
    "livecodebench": ("code", {"code"}, {"code"}, 4),
    "aime25": ("math", {"math"}, {"number"}, 3),
    "rlpr": ("reasoning", {"math", "exact"}, {"number", "math", "text"}, 4),
    "bigcodebench": ("code", {"code"}, {"code"}, 4),
}


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.jsonl"


def assert_well_formed(tasks: list[Task]) -> None:
    assert len({task.id for task in tasks}) == len(tasks), "ids must be unique"
    for task in tasks:
        assert task.difficulty in ("easy", "medium", "hard")
        json.dumps(task.metadata)  # must be JSON as it is, not only through default=str
        assert Task.from_record(json.loads(json.dumps(task.to_record()))) == task


# ---------------------------------------------------------------------------- benchmarks


def test_every_benchmark_has_a_fixture_and_an_expectation():
    assert set(BENCHMARK_LOADERS) == set(EXPECTED)
    for name in BENCHMARK_LOADERS:
        assert fixture(name).is_file(), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_benchmark_loader_maps_its_fixture(name):
    domain, verifiers, formats, n = EXPECTED[name]
    tasks = BENCHMARK_LOADERS[name](data_files=fixture(name))
    assert len(tasks) == n
    assert_well_formed(tasks)
    assert {task.source for task in tasks} == {name}
    assert {task.domain for task in tasks} == {domain}
    assert {task.verifier for task in tasks} <= verifiers
    assert {task.answer_format for task in tasks} <= formats
    assert all(task.id.startswith(f"{name}/") for task in tasks)
    # deterministic: the same call gives the same tasks
    assert BENCHMARK_LOADERS[name](data_files=str(fixture(name))) == tasks


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_limit_takes_a_seeded_sample_in_source_order(name):
    everything = BENCHMARK_LOADERS[name](data_files=fixture(name))
    sample = BENCHMARK_LOADERS[name](data_files=fixture(name), limit=2, seed=1)
    assert len(sample) == 2
    assert BENCHMARK_LOADERS[name](data_files=fixture(name), limit=2, seed=1) == sample
    ids = [task.id for task in everything]
    assert [ids.index(task.id) for task in sample] == sorted(ids.index(task.id) for task in sample)
    assert BENCHMARK_LOADERS[name](data_files=fixture(name), limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        BENCHMARK_LOADERS[name](data_files=fixture(name), limit=-1)


def test_math500_fields_and_level_difficulty():
    tasks = BENCHMARK_LOADERS["math500"](data_files=fixture("math500"))
    first = tasks[0]
    assert first.id == "math500/test/prealgebra/1021"
    assert first.answer == "\\frac{5}{6}"
    assert first.question.startswith("What is the value of")
    assert first.metadata["subject"] == "Prealgebra" and first.metadata["level"] == 1
    assert [task.difficulty for task in tasks] == ["easy", "easy", "medium", "hard", "hard"]


def test_mmlu_lists_lettered_choices_and_answers_with_the_letter():
    tasks = BENCHMARK_LOADERS["mmlu"](data_files=fixture("mmlu"))
    first = tasks[0]
    assert first.answer == "B"
    assert first.metadata["choices"] == ["Volt", "Coulomb", "Ampere", "Ohm"]
    for letter, choice in zip("ABCD", first.metadata["choices"], strict=True):
        assert f"{letter}) {choice}" in first.question
    assert first.id == "mmlu/test/0"
    assert [task.answer for task in tasks] == ["B", "B", "C", "A"]


def test_mmlu_accepts_letter_answers_and_rejects_bad_ones():
    from conductor_pipeline.tasks.sources.benchmarks import mmlu_task

    row = {"question": "2+2?", "choices": ["3", "4"], "answer": "b", "subject": "x"}
    assert mmlu_task(row, index=0).answer == "B"
    with pytest.raises(ValueError, match="outside"):
        mmlu_task({**row, "answer": 5}, index=0)


def test_gpqa_shuffle_is_deterministic_and_the_gold_letter_points_at_the_correct_text():
    rows = read_local_rows(fixture("gpqa_diamond"))
    orders = {}
    for seed in range(6):
        tasks = load_gpqa_diamond(data_files=fixture("gpqa_diamond"), seed=seed)
        assert tasks == load_gpqa_diamond(data_files=fixture("gpqa_diamond"), seed=seed)
        for task, row in zip(tasks, rows, strict=True):
            choices = task.metadata["choices"]
            assert sorted(choices) == sorted(
                row[key].strip()
                for key in (
                    "Correct Answer",
                    "Incorrect Answer 1",
                    "Incorrect Answer 2",
                    "Incorrect Answer 3",
                )
            )
            assert choices["ABCD".index(task.answer)] == row["Correct Answer"].strip()
            assert f"{task.answer}) {row['Correct Answer'].strip()}" in task.question
        orders[seed] = [tuple(task.metadata["choices"]) for task in tasks]
    assert len({tuple(order) for order in orders.values()}) > 1, "the seed should change the order"
    # the order depends on the record, not on which rows were kept
    sampled = load_gpqa_diamond(data_files=fixture("gpqa_diamond"), seed=3, limit=1)
    full = {task.id: task for task in load_gpqa_diamond(data_files=fixture("gpqa_diamond"), seed=3)}
    assert sampled[0] == full[sampled[0].id]


def test_gpqa_difficulty_comes_from_the_writers_estimate():
    tasks = load_gpqa_diamond(data_files=fixture("gpqa_diamond"))
    assert [task.difficulty for task in tasks] == ["easy", "medium", "hard"]
    assert tasks[0].id == "gpqa_diamond/recA1b2C3d4E5f6G7"
    assert tasks[0].metadata["subdomain"] == "Quantum Mechanics"


def test_livecodebench_decodes_compressed_private_tests():
    tasks = {task.id: task for task in load_livecodebench(data_files=fixture("livecodebench"))}
    assert set(tasks) == {
        "livecodebench/abc999_a",
        "livecodebench/1999B",
        "livecodebench/3421",
        "livecodebench/arc999_c",
    }
    first = tasks["livecodebench/abc999_a"]
    # two public tests plus the private one stored as plain JSON
    assert first.metadata["tests"] == [
        {"input": "3 4\n", "output": "7\n"},
        {"input": "-1 1\n", "output": "0\n"},
        {"input": "1000000000 1000000000\n", "output": "2000000000\n"},
    ]
    assert first.metadata["n_public_tests"] == 2
    assert first.metadata["test_style"] == "stdin"
    assert first.answer == ""
    assert "standard input" in first.question and "Sum of Two" in first.question
    # the private tests stored as base64(zlib(pickle(JSON text))) are decoded and used
    assert tasks["livecodebench/1999B"].metadata["tests"] == [
        {"input": "5\naabbb\n", "output": "3\n"},
        {"input": "1\na\n", "output": "1\n"},
        {"input": "6\nabbbba\n", "output": "4\n"},
    ]
    assert tasks["livecodebench/1999B"].metadata["n_public_tests"] == 1
    assert [task.difficulty for task in tasks.values()] == ["easy", "medium", "easy", "hard"]
    public_only = load_livecodebench(data_files=fixture("livecodebench"), private_tests=False)
    assert [len(t.metadata["tests"]) for t in public_only] == [2, 1, 1, 2]


def _lcb_row(private: str, **extra: str) -> dict[str, str]:
    row = {
        "question_title": "T",
        "question_content": "Echo the input.",
        "platform": "atcoder",
        "question_id": "abc000_x",
        "contest_date": "2024-01-01T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
        "private_test_cases": private,
        "metadata": "{}",
    }
    return row | extra


def _compress(payload: bytes) -> str:
    import base64
    import zlib

    return base64.b64encode(zlib.compress(payload)).decode()


class _Exploit:
    """Pickles as a call to os.system: what a poisoned dataset would ship."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_livecodebench_refuses_a_pickle_that_would_run_code(tmp_path):
    import pickle

    from conductor_pipeline.tasks.sources.benchmarks import UnsafeTestData, livecodebench_task

    marker = tmp_path / "exploited"
    row = _lcb_row(_compress(pickle.dumps(_Exploit(marker))))
    with pytest.raises(UnsafeTestData, match=r"abc000_x.*private.*system.*refused"):
        livecodebench_task(row, index=0)
    assert not marker.exists()
    # the same through the loader, as a file
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(UnsafeTestData):
        load_livecodebench(data_files=path)
    assert not marker.exists()
    # a payload that builds an object from a class is refused too, not only calls
    with pytest.raises(UnsafeTestData, match="collections.OrderedDict"):
        import collections

        livecodebench_task(_lcb_row(_compress(pickle.dumps(collections.OrderedDict()))), index=0)


def test_livecodebench_plain_data_pickles_decode_and_garbage_is_an_error():
    import pickle

    from conductor_pipeline.tasks.sources.benchmarks import decode_livecodebench_tests

    cases = [{"input": "2\n", "output": "2\n", "testtype": "stdin"}]
    # LiveCodeBench pickles the JSON text; bytes or the list itself are plain data as well,
    # in any protocol that needs no global for them (protocol 2 bytes need _codecs: refused).
    for payload, protocol in ((json.dumps(cases), 2), (json.dumps(cases).encode(), 4), (cases, 5)):
        decoded = decode_livecodebench_tests(_compress(pickle.dumps(payload, protocol=protocol)))
        assert decoded == cases
    assert decode_livecodebench_tests("") == decode_livecodebench_tests(None) == []
    with pytest.raises(ValueError, match="neither JSON nor"):
        decode_livecodebench_tests("not base64 at all!", where="problem 7")
    with pytest.raises(ValueError, match="not a readable pickle"):
        decode_livecodebench_tests(_compress(b"\x80\x04garbage"))


def test_livecodebench_functional_problems_are_kept_and_date_window():
    tasks = load_livecodebench(data_files=fixture("livecodebench"))
    leetcode = next(task for task in tasks if task.id == "livecodebench/3421")
    assert leetcode.metadata["test_style"] == "functional"
    assert leetcode.metadata["func_name"] == "maxPairSum"
    assert leetcode.metadata["tests"] == [
        {"input": "[1, 5, 3]", "output": "8", "testtype": "functional"},
        {"input": "[2, 2]", "output": "4", "testtype": "functional"},
        {"input": "[-5, -1, -3]", "output": "-4", "testtype": "functional"},
    ]
    assert "class Solution" in leetcode.question
    without = load_livecodebench(data_files=fixture("livecodebench"), include_functional=False)
    assert "livecodebench/3421" not in {task.id for task in without}
    window = load_livecodebench(
        data_files=fixture("livecodebench"), start_date="2024-01-01", end_date="2024-12-31"
    )
    assert [task.id for task in window] == ["livecodebench/1999B", "livecodebench/3421"]
    since = load_livecodebench(
        data_files=fixture("livecodebench"), start_date=datetime.date(2024, 8, 10)
    )
    assert [task.id for task in since] == ["livecodebench/1999B", "livecodebench/arc999_c"]


def test_livecodebench_version_tags_select_the_hub_files():
    assert livecodebench_files("release_v1") == ["test.jsonl"]
    assert livecodebench_files("release_v3") == ["test.jsonl", "test2.jsonl", "test3.jsonl"]
    assert len(livecodebench_files("release_v6")) == 6 == len(livecodebench_files("release_latest"))
    assert livecodebench_files("v6") == ["test6.jsonl"]
    assert livecodebench_files("v2_v3") == ["test2.jsonl", "test3.jsonl"]
    with pytest.raises(ValueError, match="release_v9"):
        livecodebench_files("release_v9")


def test_aime25_answers_are_integers_for_the_math_verifier():
    tasks = BENCHMARK_LOADERS["aime25"](data_files=fixture("aime25"))
    assert [task.answer for task in tasks] == ["38", "6", "17"]
    assert [task.id for task in tasks] == ["aime25/0", "aime25/1", "aime25/2"]
    assert {task.difficulty for task in tasks} == {"hard"}


def test_rlpr_question_is_the_user_message_and_verifier_follows_the_ground_truth():
    tasks = BENCHMARK_LOADERS["rlpr"](data_files=fixture("rlpr"))
    assert tasks[0].question.startswith("A 2 kg block")
    assert "<think>" not in tasks[0].question
    assert [(task.answer, task.answer_format, task.verifier) for task in tasks] == [
        ("6", "number", "math"),
        ("x+1", "math", "math"),
        ("Nitrogen", "text", "exact"),
        ("2\\cos(2x)", "math", "math"),
    ]
    assert tasks[0].metadata["data_source"] == "WebInstruct-verified"
    assert tasks[0].metadata["extra_info"]["index"] == 0


def test_rlpr_accepts_a_plain_string_prompt_and_rejects_a_missing_ground_truth():
    from conductor_pipeline.tasks.sources.benchmarks import rlpr_task

    row = {"prompt": "What is 2+3?", "reward_model": {"ground_truth": "5"}}
    assert rlpr_task(row, index=7).question == "What is 2+3?"
    with pytest.raises(ValueError, match="ground_truth"):
        rlpr_task({"prompt": "Q?", "reward_model": {}}, index=0)


def test_bigcodebench_answer_is_prompt_plus_canonical_body():
    rows = read_local_rows(fixture("bigcodebench"))
    tasks = BENCHMARK_LOADERS["bigcodebench"](data_files=fixture("bigcodebench"))
    for task, row in zip(tasks, rows, strict=True):
        assert task.answer == row["complete_prompt"] + row["canonical_solution"]
        assert task.metadata["prompt"] == row["complete_prompt"]
        assert task.metadata["test"] == row["test"]
        assert task.metadata["entry_point"] == "task_func"
        assert task.metadata["test_style"] == "unittest"
        assert "```python" in task.question
        compile(task.answer + "\n" + task.metadata["test"], task.id, "exec")
    assert tasks[0].id == "bigcodebench/901"
    assert tasks[2].metadata["libs"] == ["json", "collections"]
    # every task asks the sandbox for site-packages (numpy, pandas...) and roomier limits
    assert all(task.metadata["site_packages"] is True for task in tasks)
    assert tasks[3].metadata["libs"] == ["numpy"]
    instruct = BENCHMARK_LOADERS["bigcodebench"](
        data_files=fixture("bigcodebench"), variant="instruct"
    )
    assert instruct[0].question.startswith("Return the most frequent word")


def test_local_files_in_other_formats(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = read_local_rows(fixture("mmlu"))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mmlu.parquet")
    (tmp_path / "mmlu.json").write_text(json.dumps(rows))
    expected = BENCHMARK_LOADERS["mmlu"](data_files=fixture("mmlu"))
    assert BENCHMARK_LOADERS["mmlu"](data_files=tmp_path / "mmlu.parquet") == expected
    assert BENCHMARK_LOADERS["mmlu"](data_files=[tmp_path / "mmlu.json"]) == expected
    with pytest.raises(ValueError, match=r"\.jsonl"):
        read_local_rows(tmp_path / "mmlu.txt")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hub_failure_offline_is_a_clear_runtime_error(name, monkeypatch):
    import datasets

    calls = []

    def offline(*args, **kwargs):
        calls.append((args, kwargs))
        raise ConnectionError("Couldn't reach the Hugging Face Hub (offline mode is enabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match=rf"(?s)^{name}: could not load .*data_files") as caught:
        BENCHMARK_LOADERS[name]()
    assert isinstance(caught.value.__cause__, ConnectionError)
    assert calls, "the hub loader should have been tried"
    # a local copy never touches the hub
    assert BENCHMARK_LOADERS[name](data_files=fixture(name))


def test_livecodebench_hub_call_reads_the_version_files(monkeypatch):
    import datasets

    seen = {}

    def fake(path, name=None, **kwargs):
        seen.update(path=path, name=name, **kwargs)
        return datasets.Dataset.from_list(read_local_rows(fixture("livecodebench")))

    monkeypatch.setattr(datasets, "load_dataset", fake)
    tasks = load_livecodebench(version="release_v2")
    assert len(tasks) == 4
    assert seen["path"] == "json"
    assert seen["data_files"] == {
        "test": [
            "hf://datasets/livecodebench/code_generation_lite/test.jsonl",
            "hf://datasets/livecodebench/code_generation_lite/test2.jsonl",
        ]
    }


# ---------------------------------------------------------------------------- reasoning-gym

MIX = {
    "basic_arithmetic": {"count": 6, "domain": "math", "difficulty": "easy"},
    "syllogism": {"count": 4, "domain": "logic", "difficulty": "hard"},
    "letter_counting": {"count": 3, "difficulty": "medium"},
}


def test_reasoning_gym_counts_fields_and_ids():
    tasks = load_reasoning_gym(MIX, seed=7)
    assert len(tasks) == 13
    assert_well_formed(tasks)
    by_dataset = {}
    for task in tasks:
        by_dataset.setdefault(task.metadata["dataset"], []).append(task)
        assert task.verifier == "reasoning_gym" and task.source == "reasoning_gym"
        assert set(task.metadata) == {"dataset", "entry"}
        assert set(task.metadata["entry"]) == {"question", "answer", "metadata"}
        assert task.metadata["entry"]["question"] == task.question
    assert [t.id for t in by_dataset["basic_arithmetic"]] == [
        f"rg/basic_arithmetic/7/{i}" for i in range(6)
    ]
    assert {t.answer_format for t in by_dataset["basic_arithmetic"]} == {"number"}
    assert {t.answer for t in by_dataset["syllogism"]} <= {"Yes", "No"}
    assert {t.answer_format for t in by_dataset["syllogism"]} == {"text"}
    assert {t.difficulty for t in by_dataset["syllogism"]} == {"hard"}
    # domain defaults to reasoning-gym's category
    assert {t.domain for t in by_dataset["letter_counting"]} == {"algorithmic"}


def test_reasoning_gym_is_deterministic_per_seed_and_differs_across_seeds():
    first = load_reasoning_gym(MIX, seed=7)
    assert load_reasoning_gym(MIX, seed=7) == first
    other = load_reasoning_gym(MIX, seed=8)
    assert [t.id for t in other][:1] == ["rg/basic_arithmetic/8/0"]
    # reasoning-gym seeds item i with seed + i; neighbouring seeds must still not overlap
    assert not {t.question for t in first} & {t.question for t in other}


def test_reasoning_gym_reference_answers_score_full_marks_after_a_json_round_trip():
    import reasoning_gym
    from reasoning_gym.factory import get_score_answer_fn

    tasks = load_reasoning_gym(
        {**MIX, "gsm_symbolic": {"count": 3, "domain": "math", "difficulty": "hard"}}, seed=1
    )
    for task in tasks:
        restored = Task.from_record(json.loads(json.dumps(task.to_record())))
        score = get_score_answer_fn(restored.metadata["dataset"])
        assert score(restored.answer, restored.metadata["entry"]) == 1.0, task.id
    assert reasoning_gym.create_dataset  # the library is importable offline


def test_reasoning_gym_questions_are_distinct_even_where_the_generator_repeats():
    tasks = load_reasoning_gym({"chain_sum": {"count": 60, "difficulty": "easy"}}, seed=0)
    assert len({" ".join(t.question.split()) for t in tasks}) == 60


def test_reasoning_gym_difficulty_mapping_splits_the_count_and_moves_the_knobs():
    tasks = load_reasoning_gym(
        {"basic_arithmetic": {"count": 10, "difficulty": {"easy": 1, "hard": 1}}}, seed=2
    )
    labels = [task.difficulty for task in tasks]
    assert labels.count("easy") == 5 and labels.count("hard") == 5
    assert len({task.id for task in tasks}) == 10
    digits = {
        label: {
            t.metadata["entry"]["metadata"]["num_digits"] for t in tasks if t.difficulty == label
        }
        for label in ("easy", "hard")
    }
    assert max(digits["easy"]) < min(digits["hard"])


def test_reasoning_gym_answer_with_only_an_example_solution_is_usable():
    tasks = load_reasoning_gym(
        {"propositional_logic": {"count": 3, "domain": "logic", "difficulty": "easy"}}, seed=0
    )
    assert len(tasks) == 3 and all(task.answer for task in tasks)


@pytest.mark.parametrize(
    ("datasets", "message"),
    [
        (
            {"no_such_dataset": {"count": 3}},
            r"no_such_dataset: unknown reasoning-gym dataset.*e\.g\. ab, acre",
        ),
        ({"basic_arithmetic": {"count": 0}}, r"basic_arithmetic\.count"),
        (
            {"basic_arithmetic": {"count": 2, "difficulty": "brutal"}},
            r"basic_arithmetic\.difficulty.*brutal",
        ),
        (
            {"basic_arithmetic": {"count": 2, "colour": "red"}},
            r"basic_arithmetic: unknown key 'colour'; known keys: answer_format, config, count,",
        ),
        (
            {"basic_arithmetic": {"count": 2, "config": {"no_such_knob": 1}}},
            r"basic_arithmetic\.config.*accepts",
        ),
        ({"rush_hour": {"count": 2}}, r"rush_hour: only 0 of 2"),  # no reference answers
        ({"composite": {"count": 2}}, r"composite: reasoning-gym cannot build"),
        ({}, r"at least one"),
    ],
)
def test_reasoning_gym_configuration_errors_name_the_key(datasets, message):
    with pytest.raises(ValueError, match=message):
        load_reasoning_gym(datasets, seed=0)


def test_unknown_reasoning_gym_dataset_lists_valid_names():
    with pytest.raises(ValueError) as caught:
        load_reasoning_gym({"basic_arithmetics": {"count": 1}}, seed=0)
    assert "basic_arithmetics" in str(caught.value)
    assert "did you mean basic_arithmetic" in str(caught.value)
    assert "available" in str(caught.value) and "ab, " in str(caught.value)


# ---------------------------------------------------------------------------- HumanEval


def test_humaneval_has_164_code_tasks_with_tests():
    tasks = load_humaneval()
    assert len(tasks) == 164
    assert_well_formed(tasks)
    assert tasks[0].id == "humaneval/0" and tasks[-1].id == "humaneval/163"
    for task in tasks:
        assert task.domain == "code" and task.verifier == "code" and task.answer_format == "code"
        assert set(task.metadata) >= {"prompt", "test", "entry_point"}
        assert task.answer.startswith(task.metadata["prompt"])
        assert f"def {task.metadata['entry_point']}" in task.answer
        assert "```python" in task.question and task.metadata["prompt"].strip() in task.question
    counts = {
        label: sum(t.difficulty == label for t in tasks) for label in ("easy", "medium", "hard")
    }
    assert counts == {"easy": 55, "medium": 55, "hard": 54}


def test_humaneval_limit_keeps_labels_stable():
    full = load_humaneval()
    assert load_humaneval(limit=10) == full[:10]


# ---------------------------------------------------------------------------- dispatch


def test_load_source_dispatches_and_drops_the_seed_where_unused():
    assert set(SOURCES) == {"reasoning_gym", "humaneval", *BENCHMARK_LOADERS}
    assert load_source("humaneval", seed=3, limit=2) == load_humaneval(limit=2)
    assert load_source(
        "reasoning_gym", seed=3, datasets={"basic_arithmetic": {"count": 2}}
    ) == load_reasoning_gym({"basic_arithmetic": {"count": 2}}, seed=3)
    assert load_source(
        "gpqa_diamond", seed=4, data_files=str(fixture("gpqa_diamond"))
    ) == load_gpqa_diamond(data_files=fixture("gpqa_diamond"), seed=4)


def test_load_source_rejects_unknown_sources_and_options():
    with pytest.raises(ValueError, match=r"unknown task source 'mbpp'.*humaneval"):
        load_source("mbpp")
    with pytest.raises(ValueError, match=r"source 'math500': unknown key 'shots'; known keys: "):
        load_source("math500", shots=5)


# ---------------------------------------------------------------------------- verifiers


def test_reference_answers_verify_with_the_project_verifier():
    verifiers = pytest.importorskip("conductor_pipeline.tasks.verifiers")
    tasks = load_reasoning_gym(MIX, seed=5)[::3] + load_humaneval(limit=2)
    for name in sorted(EXPECTED):
        # LiveCodeBench ships no reference solution, so it has nothing to verify here.
        if name != "livecodebench":
            tasks += BENCHMARK_LOADERS[name](data_files=fixture(name))
    for task in tasks:
        # Phrased as a worker would: code in a fence, LaTeX in a box (a bare "\frac{5}{6}"
        # reads as the number 6), everything else as is.
        if task.answer_format == "code":
            response = f"```python\n{task.answer}\n```"
        elif task.answer_format == "math":
            response = f"The answer is \\boxed{{{task.answer}}}."
        else:
            response = task.answer
        result = verifiers.verify(task, response)
        assert result.correct, f"{task.id}: reference answer did not verify: {result}"


def test_a_dataset_that_cannot_load_offline_names_the_switches(monkeypatch):
    import datasets

    from conductor_pipeline.tasks.sources.benchmark_rows import hub_rows

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hugging Face Hub (offline mode is enabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError) as err:
        hub_rows("gpqa_diamond", "Idavidrein/gpqa", split="train", name="gpqa_diamond")
    message = str(err.value)
    assert "gpqa_diamond: could not load 'Idavidrein/gpqa'" in message
    assert "export HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0" in message
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(RuntimeError) as online:
        hub_rows("gpqa_diamond", "Idavidrein/gpqa", split="train", name="gpqa_diamond")
    assert "OFFLINE" not in str(online.value).replace("offline mode", "")
