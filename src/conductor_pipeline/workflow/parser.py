"""Read a workflow out of a Conductor completion, and write one back as canonical text.

Accepted input (see :func:`parse_workflow`): free reasoning text followed by three labelled
list literals, ``model_id``, ``subtasks`` and ``access_list``, written as Python or JSON,
inside or outside code fences, after any ``<think>...</think>`` blocks; or a JSON object
with those keys. List literals are located with a bracket-balancing scanner that respects
strings and comments, then decoded with :func:`ast.literal_eval` (never ``eval``) or
:func:`json.loads`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.workflow.literal_scanner import ListScanner
from conductor_pipeline.workflow.types import (
    ParseLimits,
    Step,
    UnequalListsError,
    Workflow,
    WorkflowParseError,
)

__all__ = ["parse_workflow", "render_workflow", "workflow_from_lists"]

_DEFAULT_LIMITS = ParseLimits()
# Bounds the work on degenerate completions that repeat a label over and over.
_MAX_LABELS = 200

MODEL_ID, SUBTASKS, ACCESS = "model_id", "subtasks", "access_list"
_CANONICAL = (MODEL_ID, SUBTASKS, ACCESS)

# A label, optionally decorated with markdown/quotes (**model_id**, `subtasks`, "access"),
# then ':' or '=', optional decoration, and the opening bracket of the list. The regex
# starts at the label word so that a search skips ahead on its first letter; the
# decoration before it (up to three characters after a non-word character) is checked by
# :func:`_find_label`. The whitespace runs are possessive (``*+``): ``[ \t]*`` next to an
# optional decoration and ``\s*`` would otherwise retry every split of a long run of
# spaces (quadratic), and no other split can match because decoration, whitespace and '['
# are disjoint classes.
_DECO_CHARS = "*_`'\""
_DECO = r"[*_`'\"]{0,3}"
_LABEL_RE = re.compile(
    r"(?P<label>model[ _-]?ids?|sub[ _-]?tasks?|access[ _-]?lists?|access)(?![A-Za-z0-9])"
    + _DECO
    + r"[ \t]*+[:=][ \t]*+"
    + _DECO
    + r"\s*+\[",
    re.IGNORECASE,
)
_WORD_CHAR_RE = re.compile(r"\w")
_THINK_TAG_RE = re.compile(r"<(/?)think>", re.IGNORECASE)
# In rendered subtasks, think tags are written with an escape so that the think-stripping
# pass never sees them (the literal decoder turns \x74 back into 't').
_THINK_TAG_IN_LITERAL_RE = re.compile(r"<(/?)([tT])([hH][iI][nN][kK]>)")


def _kind(label: str) -> str:
    c = label[0].lower()
    return MODEL_ID if c == "m" else SUBTASKS if c == "s" else ACCESS


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # pragma: no cover - repr of literals does not fail
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------
# Locating and decoding list literals
# ---------------------------------------------------------------------------------------


@dataclass
class _Record:
    kind: str
    value: Any = None
    error: str | None = None


def _decode(literal: str, original: str, kind: str) -> Any:
    errors: list[str] = []
    candidates = (original,) if literal == original else (original, literal)
    for source in candidates:
        try:
            return _whole_characters(ast.literal_eval(source))
        except (RecursionError, MemoryError):
            raise WorkflowParseError(f"the {kind} list is too large or too deeply nested") from None
        except Exception as exc:  # SyntaxError, ValueError, TypeError, ...
            errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
        try:
            return _whole_characters(json.loads(source))
        except (RecursionError, MemoryError):
            raise WorkflowParseError(f"the {kind} list is too large or too deeply nested") from None
        except Exception:
            pass
    raise WorkflowParseError(
        f"the {kind} list is not a valid Python or JSON literal ({errors[0][:120]})"
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _whole_characters(value: Any) -> Any:
    """``value`` with its strings made valid Unicode. A model writing JSON escapes writes a
    character beyond U+FFFF as two (``"\\ud83d\\ude00"``); Python's literals read them as two
    lone surrogates, which no UTF-8 text (a worker request, the API's response) can hold.
    Pairs become their character, a surrogate left alone becomes U+FFFD."""
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_whole_characters(v) for v in value]
    return value


def _strip_think(text: str) -> str:
    """Remove reasoning blocks; a block that never closes means there is no answer.

    One linear pass: an opening tag starts a block that the next closing tag ends (tags
    nested inside are ignored). A closing tag outside any block means the chat template
    opened the block for the model, so everything before it is reasoning.
    """
    if "<" not in text:
        return text
    kept: list[str] = []
    pos = 0
    inside = False
    for m in _THINK_TAG_RE.finditer(text):
        is_close = m.group(1) == "/"
        if inside:
            if is_close:
                inside = False
                pos = m.end()
                kept.append(" ")
        elif is_close:
            kept = []
            pos = m.end()
        else:
            kept.append(text[pos : m.start()])
            inside = True
    if inside:
        raise WorkflowParseError("unclosed <think> block: the completion ended before its answer")
    kept.append(text[pos:])
    return "".join(kept)


def _find_label(text: str, pos: int) -> re.Match[str] | None:
    """The first labelled list whose label (with its decoration) starts at or after ``pos``.

    Matches what ``(?<!\\w)`` + decoration + :data:`_LABEL_RE` would: a label counts if up
    to three decoration characters before it follow a non-word character or the start.
    """
    while (m := _LABEL_RE.search(text, pos)) is not None:
        label_at = m.start()
        for start in range(label_at, max(pos, label_at - 3) - 1, -1):
            if start < label_at and text[start] not in _DECO_CHARS:
                break
            if start == 0 or not _WORD_CHAR_RE.match(text, start - 1):
                return m
        pos = label_at + 1
    return None


def _collect(text: str) -> list[_Record]:
    records: list[_Record] = []
    scanner = ListScanner(text)
    m = _find_label(text, 0)
    while m is not None:
        if len(records) >= _MAX_LABELS:
            raise WorkflowParseError(
                f"more than {_MAX_LABELS} labelled lists; the completion looks degenerate"
            )
        kind = _kind(m.group("label"))
        open_at = m.end() - 1
        after = _find_label(text, m.end())  # the next label if this list is not taken
        try:
            end, literal = scanner.literal(
                open_at, kind, len(text) if after is None else after.end() - 1
            )
            value = _decode(literal, text[open_at:end], kind)
        except WorkflowParseError as exc:
            records.append(_Record(kind, error=str(exc)))
            m = after
            continue
        records.append(_Record(kind, value=value))
        # labels inside a consumed literal (e.g. in a subtask) are not labels
        m = _find_label(text, end)
    return records


def _select(records: list[_Record]) -> dict[str, _Record]:
    """Pick the last complete set of three lists.

    A set is three consecutive labelled lists with distinct labels. Sets in the canonical
    order (model_id, subtasks, access_list) are preferred, so that a stray earlier mention
    or a cut-off restatement never gets mixed into the answer; other orders (e.g. a JSON
    object with reordered keys) are the fall-back.
    """
    kinds = [r.kind for r in records]
    windows = range(len(records) - 3, -1, -1)
    chosen = next((i for i in windows if tuple(kinds[i : i + 3]) == _CANONICAL), None)
    if chosen is None:
        chosen = next((i for i in windows if len(set(kinds[i : i + 3])) == 3), None)
    if chosen is None:
        errors = [r.error for r in records if r.error]
        if errors:
            raise WorkflowParseError(errors[-1])
        found = [k for k in _CANONICAL if k in kinds]
        if not found:
            raise WorkflowParseError(
                "no workflow found: expected three labelled lists model_id, subtasks and "
                "access_list (e.g. 'model_id = [0]')"
            )
        missing = [k for k in _CANONICAL if k not in kinds]
        if missing:
            raise WorkflowParseError(
                f"incomplete workflow: found {' and '.join(found)} but no {' or '.join(missing)}"
            )
        raise WorkflowParseError(
            "incomplete workflow: model_id, subtasks and access_list are not given together"
        )
    group = {r.kind: r for r in records[chosen : chosen + 3]}
    for kind in _CANONICAL:
        if group[kind].error:
            raise WorkflowParseError(group[kind].error)
    return group


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def _is_all(x: Any) -> bool:
    return isinstance(x, str) and x.strip().lower() == "all"


_EXPECTED_POSITIONAL = "expected 'all', [] or a list of earlier step positions"
_EXPECTED_BINARY = (
    "expected 'all' or []: positional access lists are switched off for this Conductor "
    "(conductor.prompt.positional_access: false, the paper's binary access)"
)


def _resolve_access(entry: Any, i: int, positional: bool = True) -> tuple[tuple[int, ...], bool]:
    """The resolved positions of ``access_list[i]`` and whether it was written as "all".

    With ``positional`` off only "all"/["all"] and [] are valid; a position list is refused
    rather than read, because a Conductor trained and prompted for binary access that emits
    one is malformed output, and accepting it silently would reward (or serve) a format the
    prompt never offered.
    """
    where = f"access_list[{i}]"
    expected = _EXPECTED_POSITIONAL if positional else _EXPECTED_BINARY
    if isinstance(entry, str):
        if _is_all(entry):
            return tuple(range(i)), True
        raise WorkflowParseError(f"{where} is {_short(entry)}; {expected}")
    if not isinstance(entry, (list, tuple)):
        raise WorkflowParseError(f"{where} is {_short(entry)}; {expected}")
    if not entry:
        return (), False
    alls = [_is_all(x) for x in entry]
    if all(alls):
        return tuple(range(i)), True
    if not positional:
        raise WorkflowParseError(f"{where} is {_short(entry)}; {expected}")
    if any(alls):
        raise WorkflowParseError(f"{where} mixes 'all' with step positions: {_short(entry)}")
    for x in entry:
        if isinstance(x, bool) or not isinstance(x, int):
            raise WorkflowParseError(
                f"{where} contains {_short(x)}; step positions must be integers"
            )
        if x < 0:
            raise WorkflowParseError(
                f"{where} refers to step {x}; step positions must be non-negative"
            )
        if x >= i:
            raise WorkflowParseError(
                f"{where} refers to step {x}, which is not earlier than step {i}"
            )
    return tuple(sorted(set(entry))), False


def workflow_from_lists(
    model_id: Any,
    subtasks: Any,
    access_list: Any,
    n_workers: int,
    *,
    limits: ParseLimits | None = None,
    allow_empty: bool = False,
    positional_access: bool = True,
) -> Workflow:
    """Validate the three decoded lists and build a :class:`Workflow`.

    ``positional_access=False`` accepts only binary access entries ("all" or []).
    Raises :class:`WorkflowParseError` naming the first problem found.
    """
    limits = limits or _DEFAULT_LIMITS
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise WorkflowParseError(f"n_workers must be a positive integer, got {_short(n_workers)}")
    for name, value in ((MODEL_ID, model_id), (SUBTASKS, subtasks), (ACCESS, access_list)):
        if not isinstance(value, (list, tuple)):
            raise WorkflowParseError(f"{name} must be a list, got {_short(value)}")
    n = len(model_id)
    if not n == len(subtasks) == len(access_list):
        raise UnequalListsError(
            f"the three lists must have equal length, but model_id has {n} entries, "
            f"subtasks {len(subtasks)} and access_list {len(access_list)}"
        )
    if n == 0:
        if allow_empty:
            return Workflow([])
        raise WorkflowParseError(
            "empty workflow: three empty lists are only allowed in a recursion round "
            "(to keep the previous answer)"
        )
    if n > limits.max_steps:
        raise WorkflowParseError(
            f"the workflow has {n} steps; at most {limits.max_steps} are allowed"
        )
    steps: list[Step] = []
    for i in range(n):
        w = model_id[i]
        if isinstance(w, bool) or not isinstance(w, int):
            raise WorkflowParseError(f"model_id[{i}] is {_short(w)}; worker ids must be integers")
        if not 0 <= w < n_workers:
            raise WorkflowParseError(
                f"model_id[{i}] is {w}, but the pool has {n_workers} workers "
                f"(ids 0 to {n_workers - 1})"
            )
        sub = subtasks[i]
        if not isinstance(sub, str):
            raise WorkflowParseError(f"subtasks[{i}] is {_short(sub)}; subtasks must be strings")
        if not sub.strip():
            raise WorkflowParseError(f"subtasks[{i}] is empty")
        if len(sub) > limits.max_subtask_chars:
            raise WorkflowParseError(
                f"subtasks[{i}] has {len(sub)} characters; at most "
                f"{limits.max_subtask_chars} are allowed"
            )
        access, all_access = _resolve_access(access_list[i], i, positional_access)
        steps.append(Step(w, sub, access, all_access))
    return Workflow(steps)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def parse_workflow(
    text: str,
    n_workers: int,
    *,
    limits: ParseLimits | None = None,
    allow_empty: bool = False,
    positional_access: bool = True,
) -> Workflow:
    """Parse a Conductor completion into a :class:`Workflow`.

    Accepted forms:

    - free reasoning text, then the labelled lists ``model_id``, ``subtasks`` and
      ``access_list`` as Python or JSON literals. Label spellings ``model_id``/``model id``/
      ``model_ids``, ``subtasks``/``subtask``, ``access_list``/``access list``/``access``
      (any case), with ``:`` or ``=``, optionally quoted, back-ticked or bold;
    - a JSON object ``{"model_id": [...], "subtasks": [...], "access_list": [...]}``;
    - either of those inside a code fence.

    ``<think>...</think>`` blocks are removed first; an unclosed ``<think>`` means the
    completion has no answer. If the lists appear several times, the last complete set
    wins. Access entries: ``"all"``/``["all"]`` = every earlier step (none for step 0),
    ``[]`` = none, a list of ints = those earlier steps (sorted, de-duplicated). With
    ``positional_access=False`` (the paper's binary access, ``conductor.prompt.
    positional_access``) a list of ints is an error naming the entry. A step written as
    "all" gets ``Step.all_access`` (it also sees the previous round in a recursion round).

    Three empty lists are accepted only with ``allow_empty=True`` (a recursion round's
    "keep the previous answer"). Every problem raises :class:`WorkflowParseError`;
    no other exception escapes.
    """
    try:
        return _parse(text, n_workers, limits or _DEFAULT_LIMITS, allow_empty, positional_access)
    except WorkflowParseError:
        raise
    except Exception as exc:  # defensive: the contract is "only WorkflowParseError"
        raise WorkflowParseError(
            f"could not parse the workflow ({type(exc).__name__}: {str(exc)[:120]})"
        ) from exc


def _parse(
    text: str, n_workers: int, limits: ParseLimits, allow_empty: bool, positional_access: bool
) -> Workflow:
    if not isinstance(text, str):
        raise WorkflowParseError(f"expected the completion as a str, got {type(text).__name__}")
    if len(text) > limits.max_text_chars:
        raise WorkflowParseError(
            f"the completion has {len(text)} characters; at most {limits.max_text_chars} are parsed"
        )
    group = _select(_collect(_strip_think(text)))
    return workflow_from_lists(
        group[MODEL_ID].value,
        group[SUBTASKS].value,
        group[ACCESS].value,
        n_workers,
        limits=limits,
        allow_empty=allow_empty,
        positional_access=positional_access,
    )


def attempted_steps(text: str) -> int:
    """How many steps a completion tried to write, valid or not: the length of the last
    ``model_id`` list that can be read (0 when there is none). Training counts multi-step
    attempts with it, since GRPO can only reinforce what the policy attempts, parsed or not.
    Never raises."""
    try:
        records = _collect(_strip_think(text)) if isinstance(text, str) else []
    except Exception:  # noqa: BLE001 - a count for metrics; an unreadable text attempted none
        return 0
    ids = [r.value for r in records if r.kind == MODEL_ID and isinstance(r.value, list | tuple)]
    return len(ids[-1]) if ids else 0


def _render_str(s: str) -> str:
    literal = repr(s)
    if "<" in literal:
        literal = _THINK_TAG_IN_LITERAL_RE.sub(
            lambda m: f"<{m.group(1)}\\x{ord(m.group(2)):02x}{m.group(3)}", literal
        )
    return literal


def _render_access(access: Sequence[int], i: int, all_access: bool = False) -> str:
    if all_access:
        return '"all"'
    if not access:
        return "[]"
    if len(access) == i and tuple(access) == tuple(range(i)):
        return '"all"'
    return "[" + ", ".join(str(j) for j in access) + "]"


def render_workflow(workflow: Workflow, ids_last: bool = False) -> str:
    """The canonical text of a workflow: three labelled Python list literals.

    ``parse_workflow(render_workflow(wf), n)`` returns ``wf`` again (with
    ``allow_empty=True`` for the empty workflow). Access is written as ``"all"`` when a step
    sees every earlier step or is marked ``all_access`` (so a step 0 written as "all" keeps
    that meaning), ``[]`` when it sees none, else as a position list. ``ids_last``: the
    ``model_id`` list after the other two (the parser reads the lists in any order).
    """
    steps = workflow.steps
    model_id = "[" + ", ".join(str(s.worker) for s in steps) + "]"
    subtasks = "[" + ", ".join(_render_str(s.subtask) for s in steps) + "]"
    access = (
        "["
        + ", ".join(_render_access(s.access, i, s.all_access) for i, s in enumerate(steps))
        + "]"
    )
    if ids_last:
        return f"subtasks = {subtasks}\naccess_list = {access}\nmodel_id = {model_id}"
    return f"model_id = {model_id}\nsubtasks = {subtasks}\naccess_list = {access}"
