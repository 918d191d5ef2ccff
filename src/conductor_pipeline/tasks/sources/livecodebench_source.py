"""LiveCodeBench: competitive programming problems with stdin or LeetCode-style tests.

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
"""

from __future__ import annotations

import base64
import binascii
import datetime
import io
import json
import pickle
import re
import zlib
from collections.abc import Mapping
from typing import Any

from conductor_pipeline.tasks.sources._common import (
    check_limit,
    derived_seed,
    seeded_subset,
)
from conductor_pipeline.tasks.sources.benchmark_rows import (
    CODE_FENCE_INSTRUCTION,
    DataFiles,
    hub_rows,
    id_part,
    read_local_rows,
)
from conductor_pipeline.tasks.types import Task

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
        id=f"livecodebench/{id_part(question_id)}",
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
        return hub_rows("livecodebench", "json", data_files={split: urls}, split=split)

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
