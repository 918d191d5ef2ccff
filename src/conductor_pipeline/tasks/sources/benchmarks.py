"""The paper's benchmarks, loaded through Hugging Face ``datasets`` (or from local copies).

Each benchmark has a pure ``<name>_task(row, ...)`` that maps one row of the hub dataset's
schema to a :class:`Task`, and a ``load_<name>(*, split, limit, data_files, seed, ...)``
that fetches the rows and maps them. ``data_files`` (one path or several: ``.jsonl``,
``.json``, ``.parquet`` or ``.csv``) reads a local copy in the hub schema instead of calling
``datasets.load_dataset``; without it, the hub dataset must already be in the Hugging Face
cache when running offline, and a failed load raises ``RuntimeError`` that says so.
``limit`` keeps a seeded sample of that many rows, in source order. ``seed`` also fixes
GPQA's choice order.

Schemas and choices (hub id, default split):

- ``math500`` (HuggingFaceH4/MATH-500, test): problem, solution, answer, subject, level 1-5,
  unique_id. Verifier ``math``; difficulty: levels 1-2 easy, 3 medium, 4-5 hard.
- ``mmlu`` (cais/mmlu, config ``all``, test): question, subject, choices (4), answer (0-3 or
  a letter). Verifier ``multiple_choice``; domain ``knowledge``; difficulty ``medium`` (no
  per-item signal).
- ``gpqa_diamond`` (Idavidrein/gpqa, config ``gpqa_diamond``, train — its only split):
  Question, Correct Answer, Incorrect Answer 1-3, Record ID, Subdomain, High-level domain,
  Writer's Difficulty Estimate. The four options are shuffled with a generator seeded by
  (seed, record), so an order depends on neither row position nor ``limit``; domain
  ``science``; difficulty from the writer's estimate (easy undergraduate → easy, hard
  undergraduate → medium, graduate and beyond or missing → hard).
- ``livecodebench`` (livecodebench/code_generation_lite, test): question_title,
  question_content, platform, question_id, contest_date, starter_code, difficulty,
  public_test_cases and private_test_cases (JSON strings of {input, output, testtype}),
  metadata (JSON string; ``func_name`` for LeetCode problems). The hub repository's loading
  script no longer runs under ``datasets`` 4+, so its JSONL files are read directly and
  ``version`` (``release_v1`` … ``release_v6``, ``release_latest``, ``v2``, ``v1_v3``)
  selects them as the script did. Private tests are plain JSON or, in the hub files,
  base64 → zlib → pickle → JSON string; the pickle is read by an unpickler that refuses
  every global, so only plain data can come out and nothing from the dataset is executed
  (a payload that names a global raises ``UnsafeTestData``). LeetCode problems
  ("functional" tests, ``func_name`` in metadata) call ``Solution().<func_name>`` on JSON
  arguments; ``include_functional=False`` drops them. No reference solution exists:
  ``answer`` is empty.
- ``aime25`` (math-ai/aime25, test): problem (or question), answer, id. Integer answers,
  verifier ``math``, difficulty ``hard``.
- ``rlpr`` (openbmb/RLPR-Train-Dataset, train; the verl layout also used by the RLPR test
  sets): prompt (chat messages; the last user message is the question) or a plain string,
  reward_model.ground_truth, data_source, ability, extra_info. Ground truths with digits or
  LaTeX go to the ``math`` verifier, other text to ``exact``; domain ``reasoning``,
  difficulty ``medium``.
- ``bigcodebench`` (bigcode/bigcodebench, split = version, default v0.1.4): task_id,
  complete_prompt, instruct_prompt, code_prompt, canonical_solution, test (a unittest
  ``TestCases`` class), entry_point, libs. ``answer`` is complete_prompt plus the canonical
  body; ``variant`` picks the complete or instruct prompt; difficulty from the canonical body
  size (≤10 non-blank lines easy, ≤25 medium, longer hard). Its tasks import numpy, pandas
  and friends, so they run in the code sandbox with the interpreter's site-packages and
  roomier limits (``timeout_s``, ``memory_mb``), still without network.

Code tasks carry ``test_style`` (``check`` for HumanEval-style ``check(candidate)``,
``unittest`` for BigCodeBench, ``stdin`` / ``functional`` per LiveCodeBench test) so the
verifier need not guess.
"""

from __future__ import annotations

import ast
import base64
import binascii
import csv
import datetime
import io
import json
import os
import pickle
import random
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.tasks.sources._common import (
    check_limit,
    derived_seed,
    json_safe,
    looks_numeric,
    seeded_subset,
)
from conductor_pipeline.tasks.types import Task

DataFiles = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

LETTERS = "ABCDEFGHIJ"
MC_INSTRUCTION = "Answer with the letter of the correct choice."
CODE_FENCE_INSTRUCTION = "Reply with the complete code in a single ```python code block."


# ---------------------------------------------------------------------------- row sources


def read_local_rows(data_files: DataFiles) -> list[dict[str, Any]]:
    """Rows of local ``.jsonl``/``.json``/``.parquet``/``.csv`` files, in order."""
    paths = [data_files] if isinstance(data_files, str | os.PathLike) else list(data_files)
    if not paths:
        raise ValueError("data_files: no file given")
    rows: list[dict[str, Any]] = []
    for raw_path in paths:
        path = Path(raw_path)
        suffix = path.suffix.lower()
        if suffix in {".jsonl", ".json"}:
            rows.extend(_read_json_rows(path))
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            rows.extend(pq.read_table(path).to_pylist())
        elif suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as handle:
                rows.extend(csv.DictReader(handle))
        else:
            raise ValueError(f"data_files: {path} is not .jsonl, .json, .parquet or .csv")
    return rows


def _read_json_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError:
        # JSON lines (also what Dataset.to_json writes, whatever the file's suffix).
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(loaded, dict):
        loaded = [loaded]
    if not isinstance(loaded, list) or not all(isinstance(row, dict) for row in loaded):
        raise ValueError(
            f"data_files: {path} must hold JSON objects (a list of them or one per line)"
        )
    return loaded


def _hub_rows(
    benchmark: str, path: str, *, split: str, name: str | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    # Imported here: `datasets` is slow to import and only the full-scale profile needs it.
    import datasets

    try:
        loaded = datasets.load_dataset(path, name, split=split, **kwargs)
    except Exception as err:  # offline, not cached, gated, renamed...: all need the same advice
        what = f"{path!r}" + (f" (config {name!r})" if name else "") + f", split {split!r}"
        raise RuntimeError(
            f"{benchmark}: could not load {what} with datasets.load_dataset ({type(err).__name__}: {err}). "
            f"Download the dataset beforehand so that it is in the Hugging Face cache, "
            f"or pass a local copy in the same schema with data_files=..."
        ) from err
    return loaded.to_list()


def _rows(
    benchmark: str,
    data_files: DataFiles | None,
    hub: Callable[[], list[dict[str, Any]]],
    limit: int | None,
    seed: int,
) -> list[tuple[int, dict[str, Any]]]:
    """(source index, row) pairs, seeded-sampled down to ``limit``."""
    check_limit(limit)
    rows = read_local_rows(data_files) if data_files is not None else hub()
    return [
        (index, rows[index])
        for index in seeded_subset(len(rows), limit, derived_seed(benchmark, seed))
    ]


def _mc_question(stem: str, choices: Sequence[str]) -> str:
    listed = "\n".join(f"{LETTERS[i]}) {choice}" for i, choice in enumerate(choices))
    return f"{stem.strip()}\n\n{listed}\n\n{MC_INSTRUCTION}"


def _id_part(value: Any) -> str:
    """An id segment: path separators are fine, whitespace is not."""
    return re.sub(r"\s+", "_", str(value).strip())


# ---------------------------------------------------------------------------- MATH500


def math500_task(row: Mapping[str, Any], *, index: int, split: str = "test") -> Task:
    level = _int_or_none(row.get("level"))
    unique_id = row.get("unique_id")
    key = _id_part(unique_id).removesuffix(".json") if unique_id else f"{split}/{index}"
    return Task(
        id=f"math500/{key}",
        domain="math",
        difficulty=_math_level_difficulty(level),
        question=str(row["problem"]),
        answer=str(row["answer"]).strip(),
        answer_format="math",
        verifier="math",
        source="math500",
        metadata=json_safe(
            {
                "subject": row.get("subject"),
                "level": level,
                "unique_id": unique_id,
                "solution": row.get("solution"),
            }
        ),
    )


def load_math500(
    *,
    split: str = "test",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "HuggingFaceH4/MATH-500",
) -> list[Task]:
    rows = _rows(
        "math500", data_files, lambda: _hub_rows("math500", hub_id, split=split), limit, seed
    )
    return [math500_task(row, index=index, split=split) for index, row in rows]


def _math_level_difficulty(level: int | None) -> str:
    if level is None:
        return "medium"
    return "easy" if level <= 2 else "medium" if level == 3 else "hard"


def _int_or_none(value: Any) -> int | None:
    # MATH stores levels as ints in MATH-500 and as "Level 3" strings in older copies.
    match = re.search(r"\d+", str(value)) if value is not None else None
    return int(match.group()) if match else None


# ---------------------------------------------------------------------------- MMLU


def mmlu_task(row: Mapping[str, Any], *, index: int, split: str = "test") -> Task:
    choices = [str(choice) for choice in row["choices"]]
    gold = _gold_index(row["answer"], len(choices), where=f"mmlu row {index}")
    return Task(
        id=f"mmlu/{split}/{index}",
        domain="knowledge",
        difficulty="medium",
        question=_mc_question(str(row["question"]), choices),
        answer=LETTERS[gold],
        answer_format="letter",
        verifier="multiple_choice",
        source="mmlu",
        metadata={"choices": choices, "subject": str(row.get("subject") or "")},
    )


def load_mmlu(
    *,
    split: str = "test",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "cais/mmlu",
    config: str = "all",
) -> list[Task]:
    rows = _rows(
        "mmlu", data_files, lambda: _hub_rows("mmlu", hub_id, name=config, split=split), limit, seed
    )
    return [mmlu_task(row, index=index, split=split) for index, row in rows]


def _gold_index(answer: Any, n_choices: int, *, where: str) -> int:
    if isinstance(answer, str) and answer.strip().upper() in LETTERS[:n_choices] and answer.strip():
        return LETTERS.index(answer.strip().upper())
    try:
        gold = int(answer)
    except (TypeError, ValueError):
        raise ValueError(
            f"{where}: answer {answer!r} is neither a choice index nor a letter"
        ) from None
    if not 0 <= gold < n_choices:
        raise ValueError(f"{where}: answer index {gold} outside the {n_choices} choices")
    return gold


# ---------------------------------------------------------------------------- GPQA


def gpqa_task(row: Mapping[str, Any], *, index: int, seed: int = 0) -> Task:
    correct = _clean(row["Correct Answer"])
    options = [correct] + [_clean(row[f"Incorrect Answer {i}"]) for i in (1, 2, 3)]
    record = row.get("Record ID") or f"row{index}"
    # Seeded by the record, not the position, so the order survives sampling and reordering.
    order = list(range(len(options)))
    random.Random(derived_seed("gpqa", seed, record)).shuffle(order)
    choices = [options[i] for i in order]
    gold = order.index(0)
    return Task(
        id=f"gpqa_diamond/{_id_part(record)}",
        domain="science",
        difficulty=_gpqa_difficulty(row.get("Writer's Difficulty Estimate")),
        question=_mc_question(_clean(row["Question"]), choices),
        answer=LETTERS[gold],
        answer_format="letter",
        verifier="multiple_choice",
        source="gpqa_diamond",
        metadata={
            "choices": choices,
            "record_id": str(record),
            "subdomain": str(row.get("Subdomain") or ""),
            "high_level_domain": str(row.get("High-level domain") or ""),
        },
    )


def load_gpqa_diamond(
    *,
    split: str = "train",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "Idavidrein/gpqa",
    config: str = "gpqa_diamond",
) -> list[Task]:
    rows = _rows(
        "gpqa_diamond",
        data_files,
        lambda: _hub_rows("gpqa_diamond", hub_id, name=config, split=split),
        limit,
        seed,
    )
    return [gpqa_task(row, index=index, seed=seed) for index, row in rows]


def _clean(text: Any) -> str:
    # GPQA's CSV-born fields carry stray surrounding whitespace and newlines.
    return str(text).strip()


def _gpqa_difficulty(estimate: Any) -> str:
    text = str(estimate or "").lower()
    if text.startswith("easy undergraduate"):
        return "easy"
    if text.startswith("hard undergraduate"):
        return "medium"
    return "hard"


# ---------------------------------------------------------------------------- LiveCodeBench

_LCB_FILES = [
    "test.jsonl",
    "test2.jsonl",
    "test3.jsonl",
    "test4.jsonl",
    "test5.jsonl",
    "test6.jsonl",
]
LCB_STDIN_INSTRUCTION = (
    "Write a complete Python 3 program that reads the input from standard input and prints the "
    "answer to standard output. " + CODE_FENCE_INSTRUCTION
)
LCB_FUNCTIONAL_INSTRUCTION = (
    "Complete the starter code below (keep the class and method names). " + CODE_FENCE_INSTRUCTION
)


def livecodebench_files(version: str) -> list[str]:
    """The hub repository's JSONL files for a version tag, as its loading script chose them."""
    cumulative = re.fullmatch(r"release_v(\d+)", version)
    if cumulative and 1 <= int(cumulative.group(1)) <= len(_LCB_FILES):
        return _LCB_FILES[: int(cumulative.group(1))]
    if version == "release_latest":
        return list(_LCB_FILES)
    single = re.fullmatch(r"v(\d+)", version)
    if single and 1 <= int(single.group(1)) <= len(_LCB_FILES):
        return [_LCB_FILES[int(single.group(1)) - 1]]
    span = re.fullmatch(r"v(\d+)_v(\d+)", version)
    if span and 1 <= int(span.group(1)) <= int(span.group(2)) <= len(_LCB_FILES):
        return _LCB_FILES[int(span.group(1)) - 1 : int(span.group(2))]
    raise ValueError(
        f"livecodebench: unknown version {version!r}; use release_v1..release_v{len(_LCB_FILES)}, "
        f"release_latest, v<N> or v<A>_v<B>"
    )


def livecodebench_task(
    row: Mapping[str, Any],
    *,
    index: int,
    include_functional: bool = True,
    private_tests: bool = True,
) -> Task | None:
    """The task for one problem, or None when it has no test the verifier could run.

    Raises ``UnsafeTestData`` when the private tests are a pickle that names a global (it
    is refused, never run) and ``ValueError`` when they cannot be decoded at all.
    """
    question_id = row.get("question_id") or f"row{index}"
    where = f"livecodebench problem {question_id}"
    public = decode_livecodebench_tests(
        row.get("public_test_cases"), where=f"{where}, public tests"
    )
    private = (
        decode_livecodebench_tests(row.get("private_test_cases"), where=f"{where}, private tests")
        if private_tests
        else []
    )
    tests = public + private
    meta = _lcb_metadata(row.get("metadata"))
    kinds = {test["testtype"] for test in tests}
    functional = "functional" in kinds or bool(meta.get("func_name"))
    if not tests or (functional and not include_functional):
        return None
    starter = str(row.get("starter_code") or "")
    instruction = LCB_FUNCTIONAL_INSTRUCTION if functional else LCB_STDIN_INSTRUCTION
    parts = [
        str(row.get("question_title") or "").strip(),
        str(row["question_content"]).strip(),
        instruction,
    ]
    if starter.strip():
        parts.append(f"```python\n{starter.rstrip()}\n```")
    metadata: dict[str, Any] = {
        "tests": [
            {"input": t["input"], "output": t["output"]}
            | ({"testtype": "functional"} if functional else {})
            for t in tests
        ],
        "test_style": "functional" if functional else "stdin",
        "n_public_tests": len(public),
        "question_id": str(row.get("question_id") or ""),
        "platform": str(row.get("platform") or ""),
        "contest_date": str(row.get("contest_date") or ""),
    }
    if functional:
        metadata["starter_code"] = starter
        metadata["func_name"] = str(meta.get("func_name") or "")
    difficulty = str(row.get("difficulty") or "medium").lower()
    return Task(
        id=f"livecodebench/{_id_part(question_id)}",
        domain="code",
        difficulty=difficulty if difficulty in ("easy", "medium", "hard") else "medium",
        question="\n\n".join(part for part in parts if part),
        answer="",
        answer_format="code",
        verifier="code",
        source="livecodebench",
        metadata=metadata,
    )


def load_livecodebench(
    *,
    split: str = "test",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    version: str = "release_v6",
    start_date: str | datetime.date | None = None,
    end_date: str | datetime.date | None = None,
    include_functional: bool = True,
    private_tests: bool = True,
    hub_id: str = "livecodebench/code_generation_lite",
) -> list[Task]:
    """LiveCodeBench problems; ``start_date``/``end_date`` (ISO, inclusive) filter contest_date.

    The filters and the functional-test rule apply before ``limit`` samples.
    ``private_tests=False`` judges on the public tests only (smaller tasks, weaker check).
    """
    check_limit(limit)
    files = livecodebench_files(version)

    def hub() -> list[dict[str, Any]]:
        urls = [f"hf://datasets/{hub_id}/{name}" for name in files]
        return _hub_rows("livecodebench", "json", data_files={split: urls}, split=split)

    # Compare ISO day strings; str() also accepts the date objects YAML makes of 2024-01-01.
    first = str(start_date)[:10] if start_date else None
    last = str(end_date)[:10] if end_date else None
    rows = read_local_rows(data_files) if data_files is not None else hub()
    tasks: list[Task] = []
    for index, row in enumerate(rows):
        date = str(row.get("contest_date") or "")[:10]
        if (first and date < first) or (last and date > last):
            continue
        task = livecodebench_task(
            row, index=index, include_functional=include_functional, private_tests=private_tests
        )
        if task is not None:
            tasks.append(task)
    return [tasks[i] for i in seeded_subset(len(tasks), limit, derived_seed("livecodebench", seed))]


class UnsafeTestData(ValueError):
    """Test data that would need code from the dataset to be run in order to decode it."""


# Decoded private tests of one problem may not exceed this: LiveCodeBench's largest are
# tens of MB, and a cap stops a compression bomb from exhausting memory.
LCB_MAX_DECODED_BYTES = 512 * 1024 * 1024


class _PlainDataUnpickler(pickle.Unpickler):
    """An unpickler that can only rebuild plain data (str, bytes, numbers, lists, dicts...).

    Everything dangerous in pickle (calling a function, building an object of a class)
    first has to look up a global by name through ``find_class``; refusing every lookup
    leaves only the opcodes for built-in literal values, so loading cannot run any code.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeTestData(
            f"the pickle asks for the global {module}.{name}; only plain data "
            f"(str, bytes, numbers, lists, dicts) is accepted, so it was refused and not run"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeTestData("the pickle uses persistent ids; only plain data is accepted")


def decode_livecodebench_tests(raw: Any, *, where: str = "livecodebench") -> list[dict[str, str]]:
    """Test cases (input, output, testtype) from a LiveCodeBench test field.

    The field is a JSON list, or LiveCodeBench's compressed form: base64 of zlib of a
    pickle of the JSON text. Empty fields give []. ``UnsafeTestData`` is raised when the
    pickle names any global (see ``_PlainDataUnpickler``), ``ValueError`` when the field
    is neither form.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = _decode_compressed_tests(raw, where=where)
    if not isinstance(raw, list):
        raise ValueError(f"{where}: expected a list of test cases, got {type(raw).__name__}")
    tests = []
    for case in raw:
        if isinstance(case, Mapping) and "input" in case and "output" in case:
            tests.append(
                {
                    "input": str(case["input"]),
                    "output": str(case["output"]),
                    "testtype": str(case.get("testtype") or "stdin"),
                }
            )
    return tests


def _decode_compressed_tests(text: str, *, where: str) -> Any:
    try:
        compressed = base64.b64decode(text.encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        pickled = inflater.decompress(compressed, LCB_MAX_DECODED_BYTES + 1)
    except (binascii.Error, UnicodeEncodeError, zlib.error) as err:
        raise ValueError(
            f"{where}: neither JSON nor base64+zlib+pickle ({type(err).__name__}: {err})"
        ) from None
    if len(pickled) > LCB_MAX_DECODED_BYTES or inflater.unconsumed_tail:
        raise ValueError(f"{where}: decompresses to more than {LCB_MAX_DECODED_BYTES} bytes")
    try:
        loaded = _PlainDataUnpickler(io.BytesIO(pickled)).load()
    except UnsafeTestData as err:
        raise UnsafeTestData(f"{where}: {err}") from None
    except Exception as err:  # a corrupt pickle: truncated, bad opcode, ...
        raise ValueError(
            f"{where}: the compressed tests are not a readable pickle ({err})"
        ) from None
    if isinstance(loaded, str | bytes | bytearray):
        try:
            return json.loads(loaded)  # json reads UTF-8 bytes as well as text
        except ValueError as err:  # UnicodeDecodeError included
            raise ValueError(f"{where}: the unpickled text is not JSON ({err})") from None
    return loaded  # a list pickled directly: checked by the caller


def _lcb_metadata(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        loaded = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


# ---------------------------------------------------------------------------- AIME25


def aime25_task(row: Mapping[str, Any], *, index: int, split: str = "test") -> Task:
    problem = row.get("problem", row.get("question"))
    if problem is None:
        raise ValueError(f"aime25 row {index}: no 'problem' (or 'question') field")
    key = row.get("id")
    return Task(
        id=f"aime25/{_id_part(key)}"
        if key is not None and str(key).strip()
        else f"aime25/{split}/{index}",
        domain="math",
        difficulty="hard",
        question=str(problem),
        answer=str(row["answer"]).strip(),
        answer_format="number",
        verifier="math",
        source="aime25",
        metadata={},
    )


def load_aime25(
    *,
    split: str = "test",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "math-ai/aime25",
    config: str | None = None,
) -> list[Task]:
    rows = _rows(
        "aime25",
        data_files,
        lambda: _hub_rows("aime25", hub_id, name=config, split=split),
        limit,
        seed,
    )
    return [aime25_task(row, index=index, split=split) for index, row in rows]


# ---------------------------------------------------------------------------- RLPR

_MATHY = re.compile(r"[\d\\^_{}$=]")


def rlpr_task(row: Mapping[str, Any], *, index: int, split: str = "train") -> Task:
    question = _rlpr_question(row.get("prompt"), where=f"rlpr row {index}")
    reward_model = row.get("reward_model")
    if isinstance(reward_model, str):
        reward_model = json.loads(reward_model)
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"rlpr row {index}: no reward_model.ground_truth")
    truth = str(reward_model["ground_truth"]).strip()
    if looks_numeric(truth):
        answer_format, verifier = "number", "math"
    elif _MATHY.search(truth):
        answer_format, verifier = "math", "math"
    else:
        answer_format, verifier = "text", "exact"
    return Task(
        id=f"rlpr/{split}/{index}",
        domain="reasoning",
        difficulty="medium",
        question=question,
        answer=truth,
        answer_format=answer_format,
        verifier=verifier,
        source="rlpr",
        metadata=json_safe(
            {
                "data_source": row.get("data_source"),
                "ability": row.get("ability"),
                "extra_info": row.get("extra_info") or {},
            }
        ),
    )


def load_rlpr(
    *,
    split: str = "train",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "openbmb/RLPR-Train-Dataset",
    config: str | None = None,
) -> list[Task]:
    rows = _rows(
        "rlpr", data_files, lambda: _hub_rows("rlpr", hub_id, name=config, split=split), limit, seed
    )
    return [rlpr_task(row, index=index, split=split) for index, row in rows]


def _rlpr_question(prompt: Any, *, where: str) -> str:
    if isinstance(prompt, str):
        try:
            decoded = json.loads(prompt)
        except ValueError:
            return prompt
        prompt = decoded if isinstance(decoded, list) else prompt
        if isinstance(prompt, str):
            return prompt
    if isinstance(prompt, Iterable):
        # The system message holds RLPR's own answer-format instructions, not the question.
        users = [
            m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"
        ]
        if users and str(users[-1]).strip():
            return str(users[-1])
    raise ValueError(f"{where}: prompt has no user message")


# ---------------------------------------------------------------------------- BigCodeBench

BCB_INSTRUCTION = (
    "Complete the Python function below so that it does what its docstring describes. "
    + CODE_FENCE_INSTRUCTION
)


BCB_TIMEOUT_S = 60
BCB_MEMORY_MB = 4096


def bigcodebench_task(
    row: Mapping[str, Any],
    *,
    index: int,
    variant: str = "complete",
    timeout_s: float = BCB_TIMEOUT_S,
    memory_mb: int = BCB_MEMORY_MB,
) -> Task:
    if variant not in ("complete", "instruct"):
        raise ValueError(f"bigcodebench: variant must be 'complete' or 'instruct', got {variant!r}")
    prompt = str(row["complete_prompt"])
    body = str(row["canonical_solution"])
    if variant == "complete":
        question = f"{BCB_INSTRUCTION}\n\n```python\n{prompt.rstrip()}\n```"
    else:
        question = f"{str(row['instruct_prompt']).strip()}\n\n{CODE_FENCE_INSTRUCTION}"
    task_id = str(row.get("task_id") or f"row{index}")
    lines = sum(1 for line in body.splitlines() if line.strip())
    return Task(
        id=f"bigcodebench/{_id_part(task_id.rsplit('/', 1)[-1])}",
        domain="code",
        difficulty="easy" if lines <= 10 else "medium" if lines <= 25 else "hard",
        question=question,
        answer=prompt + body,
        answer_format="code",
        verifier="code",
        source="bigcodebench",
        metadata={
            "prompt": prompt,
            "test": str(row["test"]),
            "entry_point": str(row.get("entry_point") or "task_func"),
            "task_id": task_id,
            "libs": _libs(row.get("libs")),
            "test_style": "unittest",
            # Its tasks import numpy, pandas, matplotlib...: the sandbox must start with the
            # interpreter's site-packages, and importing those needs more than the
            # HumanEval-sized defaults (seconds of start-up, hundreds of MB mapped).
            "site_packages": True,
            "timeout_s": timeout_s,
            "memory_mb": memory_mb,
        },
    )


def load_bigcodebench(
    *,
    split: str = "v0.1.4",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    variant: str = "complete",
    timeout_s: float = BCB_TIMEOUT_S,
    memory_mb: int = BCB_MEMORY_MB,
    hub_id: str = "bigcode/bigcodebench",
) -> list[Task]:
    rows = _rows(
        "bigcodebench",
        data_files,
        lambda: _hub_rows("bigcodebench", hub_id, split=split),
        limit,
        seed,
    )
    return [
        bigcodebench_task(
            row, index=index, variant=variant, timeout_s=timeout_s, memory_mb=memory_mb
        )
        for index, row in rows
    ]


def _libs(raw: Any) -> list[str]:
    # The hub stores libs as the repr of a list; literal_eval reads literals only, never code.
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return []
    return [str(lib) for lib in raw] if isinstance(raw, list | tuple) else []


BENCHMARK_LOADERS: dict[str, Callable[..., list[Task]]] = {
    "math500": load_math500,
    "mmlu": load_mmlu,
    "gpqa_diamond": load_gpqa_diamond,
    "livecodebench": load_livecodebench,
    "aime25": load_aime25,
    "rlpr": load_rlpr,
    "bigcodebench": load_bigcodebench,
}
