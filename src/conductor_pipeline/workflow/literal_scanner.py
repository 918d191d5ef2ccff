"""Find where a bracketed list literal in a Conductor completion ends.

:class:`ListScanner` follows brackets while skipping strings (single, double, triple quoted,
with backslash escapes) and ``#`` comments, the way Python reads them, and reports the first
problem: a mismatched or missing closing bracket, an unterminated string, nesting past the
limit. The parser runs it from every labelled list it finds; the work over one text is
linear in its length however the labels overlap (see :class:`ListScanner`).
"""

from __future__ import annotations

import re

from conductor_pipeline.workflow.types import WorkflowParseError

__all__ = ["ListScanner"]

# Valid workflows nest three deep at most; anything much deeper is garbage and would only
# risk RecursionError/MemoryError inside the literal decoders.
_MAX_NESTING = 32
# Characters the bracket scanner must look at; everything else is skipped in one jump.
_INTERESTING_RE = re.compile(r"[\[\](){}\"'#]")
_CLOSERS = {"[": "]", "(": ")", "{": "}"}
_INTERESTING = frozenset("[](){}\"'#")
_OPENERS = {v: k for k, v in _CLOSERS.items()}

# How the scan of one nesting level ends: at a closing bracket (which may or may not match
# the level's opener), or with an error that ends every enclosing level too.
_CLOSED, _MISMATCH, _UNTERMINATED, _EOF, _TOO_DEEP = range(5)


def _is_escaped(text: str, q: int) -> bool:
    """Whether the quote at ``text[q]`` follows an odd run of backslashes."""
    size = 16
    while True:  # strip backslashes from ever larger windows: C speed on any run length
        lo = max(0, q - size)
        kept = len(text[lo:q].rstrip("\\"))
        if kept or lo == 0:
            return (q - lo - kept) % 2 == 1
        size *= 4


class ListScanner:
    """Finds where each labelled list literal of one text ends, in linear time overall.

    Labels can sit inside an earlier literal that did not close (a cut-off completion, or
    hostile text), and each starts a scan of its own over the same stretch. Two facts keep
    the total work linear however many scans overlap:

    - outside strings, how a scan proceeds from a token depends only on the token's
      position, and relative to the bracket depth there, so "the rest of this nesting level
      from token p" (how it ends, where, and how deep it goes) is memoised per token;
    - a string ends at the first quote after it that is not escaped, and whether a quote is
      escaped (an odd run of backslashes before it) does not depend on where the string
      opened, so each quote is classified once and the string's end memoised per quote.

    The first scan over a stretch of text (the usual case: labels that follow each other)
    keeps no memo before the next label and stops at the nesting limit, like a plain scan.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self._levels: dict[int, tuple[int, int, int]] = {}  # token -> (how, where, depth)
        self._string_ends: dict[tuple[str, int], int] = {}  # (quote, occurrence) -> end or -1
        self._reached = -1  # the furthest position any scan has looked at

    def literal(self, start: int, kind: str, next_label: int) -> tuple[int, str]:
        """Return (end, literal) for the bracketed literal opening at ``text[start]``.

        ``next_label`` is where the next label's list opens (or the text's length): only
        scans from there on can need what this scan memoises.

        The literal is returned with raw line breaks inside single-line strings escaped (a
        common slip of small models); the decoder tries the original text first.
        """
        text = self.text
        if start > self._reached:  # the first scan of this stretch
            how, at, depth = self._scan(start, record_from=next_label, limit=True)
        else:  # inside an earlier scan: walk in full, sharing what it memoised
            how, at, depth = self._scan(start, record_from=start, limit=False)
        if how == _TOO_DEEP or depth + 1 > _MAX_NESTING:  # +1: the list's own bracket
            raise WorkflowParseError(
                f"the {kind} list is nested more than {_MAX_NESTING} levels deep"
            )
        if how == _CLOSED and text[at] != _CLOSERS[text[start]]:
            how = _MISMATCH
        if how == _MISMATCH:
            raise WorkflowParseError(
                f"the {kind} list has a mismatched {text[at]!r} at character {at}"
            )
        if how == _UNTERMINATED:
            raise WorkflowParseError(
                f"the {kind} list has an unterminated string starting at character {at}"
            )
        if how == _EOF:
            raise WorkflowParseError(
                f"the {kind} list opened at character {start} is never closed "
                "(unbalanced brackets, or the completion was cut off)"
            )
        end = at + 1
        literal = text[start:end]
        if "\n" in literal or "\r" in literal:
            fixes = self._multiline_strings(start, end)
            if fixes:
                literal = _escape_newlines(text, start, end, fixes)
        return end, literal

    def _scan(self, start: int, record_from: int, limit: bool) -> tuple[int, int, int]:
        """How the list opening at ``text[start]`` ends: (how, where, depth below it).

        Tokens from ``record_from`` on are memoised ("the rest of this level": how it ends,
        where, how deep it goes) for later scans starting inside this one; the scan reuses
        what earlier scans memoised. With ``limit`` it stops as soon as the nesting limit is
        passed; the levels it leaves open stay unmemoised (a later scan from inside them
        walks them once in full). Uses an explicit stack, never recursion.
        """
        text, memo = self.text, self._levels
        n = len(text)
        search = _INTERESTING_RE.search
        tokens: list[int] = []  # the tokens on the open levels; -1 - position: not memoised
        depths: list[int] = []  # per token: how deep its group went (openers), else 0
        starts: list[int] = []  # where each open level below the first begins in ``tokens``
        seen = self._reached  # beyond it no scan has been: nothing memoised to look up
        pos = start + 1
        while True:
            if pos < n and text[pos] in _INTERESTING:
                i = pos  # adjacent tokens are common in hostile text: skip the search call
            else:
                m = search(text, pos)
                i = n if m is None else m.start()
            found = memo.get(i) if i <= seen else None
            if found is None:
                c = text[i] if i < n else "$"  # "$": end of text, no token
                if c in _CLOSERS:
                    if limit and len(starts) + 2 > _MAX_NESTING:  # +2: the list's bracket, c
                        self._reached = max(self._reached, i)
                        return _TOO_DEEP, i, len(starts) + 1
                    tokens.append(i if i >= record_from else -1 - i)
                    depths.append(0)
                    starts.append(len(tokens))
                    pos = i + 1
                    continue
                if c in "#'\"":
                    end = self._skip(i)
                    if end >= 0:
                        if i >= record_from:
                            tokens.append(i)
                            depths.append(0)
                        pos = end
                        continue
                    found = (_UNTERMINATED, i, 0)
                elif i == n:
                    found = (_EOF, n, 0)
                elif starts and text[i - 1] == _OPENERS[c]:
                    starts.pop()  # an empty group such as "[]": nothing to memoise
                    depths[-1] = 1
                    pos = i + 1
                    continue
                else:
                    found = (_CLOSED, i, 0)
                memo[i] = found
            how, at, depth = found
            while True:  # the innermost open level ends here, alike for all its tokens
                first = starts[-1] if starts else 0
                found = (how, at, depth)
                for k in range(len(tokens) - 1, first - 1, -1):
                    if depths[k] > depth:
                        depth = depths[k]
                        found = (how, at, depth)
                    if tokens[k] >= 0:
                        memo[tokens[k]] = found
                del tokens[first:], depths[first:]
                if not starts:
                    self._reached = max(self._reached, at if how != _UNTERMINATED else n)
                    return found
                starts.pop()
                depth += 1
                depths[-1] = depth  # the level's opener, now the last open token
                if how == _CLOSED:
                    opener = tokens[-1]
                    if text[at] == _CLOSERS[text[opener if opener >= 0 else -1 - opener]]:
                        pos = at + 1  # a balanced group: the enclosing level goes on
                        break
                    how = _MISMATCH

    def _skip(self, i: int) -> int:
        """End of the comment or string starting at ``text[i]``; -1 if the string never closes."""
        text = self.text
        c = text[i]
        if c == "#":
            nl = text.find("\n", i)
            return len(text) if nl < 0 else nl + 1
        quote = c * 3 if text.startswith(c * 3, i) else c
        pos = i + len(quote)
        q = text.find(quote, pos)
        if q < 0 or text[q - 1] != "\\":
            return q if q < 0 else q + len(quote)  # the common case: no escapes to resolve
        seen: list[tuple[str, int]] = []
        while True:
            q = text.find(quote, pos)
            if q < 0:
                end = -1
                break
            known = self._string_ends.get((quote, q))
            if known is not None:
                end = known
                break
            seen.append((quote, q))
            if not _is_escaped(text, q):
                end = q + len(quote)
                break
            pos = q + 1
        for key in seen:
            self._string_ends[key] = end
        return end

    def _multiline_strings(self, start: int, end: int) -> list[tuple[int, int]]:
        """Spans of single-quoted strings holding raw line breaks in a closed literal."""
        text = self.text
        search = _INTERESTING_RE.search
        fixes: list[tuple[int, int]] = []
        pos = start + 1
        while (m := search(text, pos, end)) is not None:
            i = m.start()
            if text[i] not in "#'\"":
                pos = i + 1
                continue
            pos = self._skip(i)  # closes: the literal was scanned as closed
            if text[i] != "#" and not text.startswith(text[i] * 3, i):
                span = text[i:pos]
                if "\n" in span or "\r" in span:
                    fixes.append((i, pos))
        return fixes


def _escape_newlines(text: str, start: int, end: int, fixes: list[tuple[int, int]]) -> str:
    parts: list[str] = []
    pos = start
    for a, b in fixes:
        parts.append(text[pos:a])
        parts.append(text[a:b].replace("\r", "\\r").replace("\n", "\\n"))
        pos = b
    parts.append(text[pos:end])
    return "".join(parts)
