"""Procedural tasks from reasoning-gym, generated offline and checked by its own scorers.

Configuration (``conf/*/parameters_data_prep.yml``, under ``sources.reasoning_gym.datasets``)
maps a reasoning-gym dataset name to its options::

    basic_arithmetic: {count: 60, domain: math, difficulty: easy}
    knights_knaves:   {count: 60, domain: logic, difficulty: {easy: 1, hard: 1}}
    chain_sum:        {count: 40, domain: math, difficulty: hard, levels: {hard: 5},
                       config: {allow_negation: false}}

- ``count`` (required): how many distinct tasks to produce.
- ``domain``: the task domain; defaults to reasoning-gym's category (``arithmetic``, ``logic``...).
- ``difficulty``: ``easy`` / ``medium`` (default) / ``hard``, or a mapping from those labels to
  relative shares of ``count``. Where the dataset has a reasoning-gym *curriculum* (102 of 106
  do), the label selects a curriculum level (easy 0, medium 1, hard 2, each clamped to the
  attribute's last level; ``levels`` overrides the numbers), whose knob values become the
  generator's configuration. Datasets without a curriculum (``gsm_symbolic``, ``acre``,
  ``list_functions``, ``composite``) only carry the label.
- ``config``: extra keyword arguments for ``create_dataset``; they win over curriculum knobs.
- ``answer_format``: overrides the per-item guess (a plain number → ``number``, else ``text``).

Every item is checked before it becomes a task: its entry must survive a JSON round trip and
its reference answer must score 1.0 with the dataset's scorer under the default configuration,
which is exactly what ``verify`` can rebuild from the task's metadata. Items that fail, repeat
an earlier question, or have no single reference answer are skipped (the generator is drawn
further); a dataset that cannot fill ``count`` this way raises ``ValueError``.

Datasets checked offline through this loader (2-core CPU; seconds to generate *and check*
100 items at easy / medium / hard, after reasoning-gym is imported; answers are short):

- math: ``basic_arithmetic`` 0.01/0.01/0.01 (integer), ``chain_sum`` 0.01/0.01/0.02
  (integer), ``simple_equations`` 0.25/0.30/0.34 (integer), ``gsm_symbolic`` 0.02, label only
  (integer; word problems), ``fraction_simplification`` 0.01/0.01/0.01 (``a/b``).
- logic: ``syllogism`` 0.02/0.01/0.01 (Yes/No), ``knights_knaves`` 0.08/0.13/0.23 (one
  sentence, at most ~95 characters), ``self_reference`` 0.06/0.06/0.05 (integer),
  ``propositional_logic`` -/0.09/0.27 (a formula; its easy level is one fixed shape with
  too few distinct questions to fill 100).
- algorithmic: ``count_bits`` 0.01/0.01/0.01 and ``letter_counting`` 0.02/0.01/0.02 (integer),
  ``spell_backward`` 0.21/0.09/0.08 (a word; the first call loads a word list),
  ``base_conversion`` 0.01/0.01/0.01 (digits), ``family_relationships`` 0.01/0.01/0.01
  (one word).

Avoid for quick runs: ``bf`` (0.4 / 3.8 / ≈27 s per 100), ``futoshiki``, ``knight_swap``,
``zebra_puzzles``, ``sokoban``; ``word_sorting`` and ``number_sorting`` answers grow to
hundreds of characters above easy. ``propositional_logic`` and ``graph_color`` have no single
answer; their example solution from the metadata is used when it scores 1.0.

A survey of all 106 datasets (20 items at medium) found 93 usable. Rejected, with the reason
in the error: ``boxnet``, ``rush_hour`` (no reference answer); ``arc_agi``, ``rearc``,
``rubiks_cube`` (reference does not score 1.0 with the default-configured scorer);
``composite`` (needs sub-datasets); ``modulo_grid`` (its medium curriculum level is an invalid
configuration); ``countdown``, ``knight_swap`` (generator gives up); ``coin_flip``,
``puzzle24``, ``tower_of_hanoi`` (too few distinct questions at that level).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.tasks.sources._common import (
    DIFFICULTIES,
    derived_seed,
    json_safe,
    looks_numeric,
)
from conductor_pipeline.tasks.types import ANSWER_FORMATS, Task

logger = logging.getLogger(__name__)

SOURCE = "reasoning_gym"
_SPEC_KEYS = {"count", "domain", "difficulty", "config", "levels", "answer_format"}
_DEFAULT_LEVELS = {"easy": 0, "medium": 1, "hard": 2}
# Where datasets without a single reference answer keep a worked solution.
_EXAMPLE_ANSWER_KEYS = ("example_answer", "example_correct_answer", "possible_answer")
# Draws allowed per requested task before giving up: duplicates are common at easy levels
# (chain_sum easy: 18 % repeats), unverifiable items rare.
_DRAWS_PER_TASK = 4
_EXTRA_DRAWS = 50


def available_datasets() -> list[str]:
    """Names accepted by ``create_dataset`` in the installed reasoning-gym."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def load_reasoning_gym(datasets: dict[str, dict[str, Any]], *, seed: int) -> list[Task]:
    """Generate tasks for each configured reasoning-gym dataset.

    Ids are ``rg/<name>/<seed>/<i>`` with ``i`` the position within that dataset's tasks, so
    the same configuration and seed always give the same ids for the same questions.
    """
    if not isinstance(datasets, Mapping) or not datasets:
        raise ValueError(
            "reasoning_gym.datasets: must map at least one dataset name to its options"
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"reasoning_gym: seed must be an integer, got {seed!r}")
    known = available_datasets()
    tasks: list[Task] = []
    for name, spec in datasets.items():
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(
                f"reasoning_gym.datasets.{name}: unknown reasoning-gym dataset; {hint}"
                f"{len(known)} are available, e.g. {', '.join(known[:8])}, ..."
            )
        tasks.extend(_load_one(name, spec or {}, seed))
    return tasks


def _load_one(name: str, spec: Mapping[str, Any], seed: int) -> list[Task]:
    where = f"reasoning_gym.datasets.{name}"
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: options must be a mapping, got {spec!r}")
    check_keys(where, spec, _SPEC_KEYS)

    count = spec.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        raise ValueError(f"{where}.count: must be a positive integer, got {count!r}")
    domain = spec.get("domain") or _category(name)
    if not isinstance(domain, str):
        raise ValueError(f"{where}.domain: must be a string, got {domain!r}")
    answer_format = spec.get("answer_format")
    if answer_format is not None and answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"{where}.answer_format: must be one of {ANSWER_FORMATS}, got {answer_format!r}"
        )
    user_config = spec.get("config") or {}
    if not isinstance(user_config, Mapping):
        raise ValueError(f"{where}.config: must be a mapping, got {user_config!r}")
    if {"seed", "size"} & set(user_config):
        raise ValueError(f"{where}.config: 'seed' and 'size' are set by the loader")
    levels = {**_DEFAULT_LEVELS, **_check_levels(where, spec.get("levels"))}
    shares = _allocate(count, _difficulty_shares(where, spec.get("difficulty", "medium")))

    from reasoning_gym.factory import get_score_answer_fn, has_curriculum

    if len(shares) > 1 and not has_curriculum(name):
        logger.warning("%s: no curriculum, so its difficulty labels do not change the items", where)
    # The verifier can only rebuild a default-configured dataset from the metadata, so the
    # reference answer is checked with exactly that scorer.
    try:
        scorer = get_score_answer_fn(name)
    except Exception as err:  # e.g. "composite", whose default configuration is invalid
        raise ValueError(
            f"{where}: reasoning-gym cannot build this dataset's scorer: {err!r}"
        ) from err

    tasks: list[Task] = []
    seen: set[str] = set()
    for label, wanted in shares.items():
        knobs = _curriculum_knobs(name, levels[label]) if has_curriculum(name) else {}
        kwargs = {**knobs, **user_config}
        # reasoning-gym draws item i from Random(seed + i), so seeds s and s+1 would share all
        # but one item; hashing spreads them apart (and separates the difficulty levels).
        entries = _draw(name, where, kwargs, derived_seed(seed, name, label), wanted, scorer, seen)
        for entry, reference in entries:
            tasks.append(
                Task(
                    id=f"rg/{name}/{seed}/{len(tasks)}",
                    domain=domain,
                    difficulty=label,
                    question=entry["question"],
                    answer=reference,
                    answer_format=answer_format
                    or ("number" if looks_numeric(reference) else "text"),
                    verifier="reasoning_gym",
                    source=SOURCE,
                    metadata={"dataset": name, "entry": entry},
                )
            )
    return tasks


def _draw(
    name: str,
    where: str,
    kwargs: dict[str, Any],
    rg_seed: int,
    wanted: int,
    scorer: Callable[[str, dict[str, Any]], float],
    seen: set[str],
) -> list[tuple[dict[str, Any], str]]:
    """Draw items until ``wanted`` distinct, verifiable ones are found."""
    import reasoning_gym

    budget = wanted * _DRAWS_PER_TASK + _EXTRA_DRAWS
    try:
        dataset = reasoning_gym.create_dataset(name, seed=rg_seed, size=budget, **kwargs)
    except TypeError as err:
        from reasoning_gym.factory import DATASETS

        fields = sorted(
            f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in {"seed", "size"}
        )
        raise ValueError(f"{where}.config: {err}; the dataset accepts {fields}") from err
    except (AssertionError, ValueError) as err:
        raise ValueError(
            f"{where}: configuration {kwargs!r} rejected by reasoning-gym: {err or 'assertion failed'}"
        ) from err

    found: list[tuple[dict[str, Any], str]] = []
    skipped = {"duplicate": 0, "no reference answer": 0, "reference does not verify": 0}
    # Some generators (bf) print while they work; keep that out of pipeline logs.
    with contextlib.redirect_stdout(io.StringIO()):
        for index in range(budget):
            if len(found) == wanted:
                break
            try:
                raw = dataset[index]
            except Exception as err:  # generators give up on some configurations
                raise ValueError(
                    f"{where}: reasoning-gym failed to generate item {index} with {kwargs!r}: {err!r}"
                ) from err
            key = " ".join(str(raw["question"]).split())
            if key in seen:
                skipped["duplicate"] += 1
                continue
            reference = _reference_answer(raw)
            if reference is None:
                skipped["no reference answer"] += 1
                continue
            entry = json.loads(
                json.dumps(json_safe({k: raw[k] for k in ("question", "answer", "metadata")}))
            )
            if not _scores_full_marks(scorer, reference, entry):
                skipped["reference does not verify"] += 1
                continue
            seen.add(key)
            found.append((entry, reference))
    if len(found) < wanted:
        raise ValueError(
            f"{where}: only {len(found)} of {wanted} usable items in {budget} draws "
            f"(skipped: {skipped}); lower count, pick a harder difficulty or another dataset"
        )
    if any(skipped.values()):
        logger.debug("%s: skipped %s", where, skipped)
    return found


def _reference_answer(raw: Mapping[str, Any]) -> str | None:
    answer = raw.get("answer")
    if answer is not None:
        return str(answer)
    metadata = raw.get("metadata") or {}
    for key in _EXAMPLE_ANSWER_KEYS:
        example = metadata.get(key)
        if example is not None:
            return example if isinstance(example, str) else json.dumps(json_safe(example))
    return None


def _scores_full_marks(
    scorer: Callable[[str, dict[str, Any]], float], answer: str, entry: dict[str, Any]
) -> bool:
    try:
        return float(scorer(answer, entry)) >= 1.0 - 1e-9
    except Exception:  # a scorer that cannot handle the entry makes the item unusable, nothing more
        return False


def _curriculum_knobs(name: str, level: int) -> dict[str, Any]:
    """Configuration values of ``name``'s curriculum at ``level`` (clamped per attribute)."""
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import create_curriculum

    curriculum = create_curriculum(name)
    curriculum.set_global_level(level)
    # UPPER_BOUND keeps only the top segment of each range, so "hard" does not also include
    # everything "easy" covers (the library's default, INCLUSIVE, would).
    context = DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
    knobs: dict[str, Any] = {}
    for attribute in curriculum.attributes.values():
        value = context.get_attr_value(curriculum, attribute)
        if isinstance(attribute, RangeAttributeDefinition):
            values = list(value) if isinstance(value, list | tuple) else [value]
            knobs[attribute.lower_field_name] = min(values)
            knobs[attribute.upper_field_name] = max(values)
        else:
            knobs[attribute.field_name] = value
    return knobs


def _category(name: str) -> str:
    from reasoning_gym.factory import DATASETS

    # Modules are laid out as reasoning_gym.<category>.<dataset>.
    parts = DATASETS[name][0].__module__.split(".")
    return parts[1] if len(parts) >= 3 else "other"


def _check_levels(where: str, levels: Any) -> dict[str, int]:
    if levels is None:
        return {}
    if not isinstance(levels, Mapping) or not set(levels) <= set(DIFFICULTIES):
        raise ValueError(
            f"{where}.levels: must map some of {DIFFICULTIES} to curriculum levels, got {levels!r}"
        )
    for label, level in levels.items():
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise ValueError(
                f"{where}.levels.{label}: must be a non-negative integer, got {level!r}"
            )
    return dict(levels)


def _difficulty_shares(where: str, difficulty: Any) -> dict[str, float]:
    if isinstance(difficulty, str):
        difficulty = {difficulty: 1}
    if not isinstance(difficulty, Mapping) or not difficulty:
        raise ValueError(
            f"{where}.difficulty: must be one of {DIFFICULTIES} or a mapping of them to shares"
        )
    for label, share in difficulty.items():
        if label not in DIFFICULTIES:
            raise ValueError(
                f"{where}.difficulty: unknown label {label!r}; expected {DIFFICULTIES}"
            )
        if not isinstance(share, int | float) or isinstance(share, bool) or share < 0:
            raise ValueError(
                f"{where}.difficulty.{label}: share must be a non-negative number, got {share!r}"
            )
    if sum(difficulty.values()) <= 0:
        raise ValueError(f"{where}.difficulty: shares must not all be zero")
    # Fixed label order, so that the mapping's order in YAML does not change the ids.
    return {label: float(difficulty[label]) for label in DIFFICULTIES if label in difficulty}


def _allocate(count: int, shares: dict[str, float]) -> dict[str, int]:
    """Split ``count`` by ``shares`` with the largest-remainder rule (ties: label order)."""
    total = sum(shares.values())
    exact = {label: count * share / total for label, share in shares.items()}
    counts = {label: int(value) for label, value in exact.items()}
    order = sorted(
        exact, key=lambda label: (counts[label] - exact[label], DIFFICULTIES.index(label))
    )
    for label in order[: count - sum(counts.values())]:
        counts[label] += 1
    return {label: n for label, n in counts.items() if n > 0}


__all__ = ["available_datasets", "load_reasoning_gym", "SOURCE"]
