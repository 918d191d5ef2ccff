"""MkDocs hook: the configuration reference, generated from conf/base/*.yml at build time.

The page `configuration.md` holds the marker below; each build replaces it with one section
per file of `conf/base/`, listing every key (dotted path), its value as the file loads, and the
comment written above it or after it on its line. Values are never copied by hand, so the
reference cannot drift from the configuration.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

MARKER = "<!-- config-reference -->"
PAGE = "configuration.md"
LONG_VALUE_CHARS = 100  # a list or mapping longer than this on one line is shown as YAML

# `key:` at the start of a line (after indentation); list items ("- ...") are not keys
_KEY_LINE = re.compile(
    r"^(?P<indent>\s*)(?P<key>[^\s#:'\"-][^:#]*?|'[^']*'|\"[^\"]*\"):(?=\s|$)(?P<rest>.*)$"
)
# an end-of-line comment: "#" after whitespace, with text after it
_INLINE_COMMENT = re.compile(r"\s#\s+(?P<text>.*)$")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the configuration page's marker with the reference of `<repo>/conf/base`."""
    if page.file.src_uri != PAGE or MARKER not in markdown:
        return markdown
    conf_dir = Path(config["config_file_path"]).parent / "conf" / "base"
    return markdown.replace(MARKER, config_reference(conf_dir))


def config_reference(conf_dir: Path) -> str:
    """Markdown for every `*.yml` of `conf_dir`, one section per file, files by name."""
    files = sorted(conf_dir.glob("*.yml"))
    if not files:
        raise FileNotFoundError(f"config reference: no *.yml files in {conf_dir}")
    return "\n\n".join(file_section(path, conf_dir) for path in files) + "\n"


def file_section(path: Path, conf_dir: Path) -> str:
    text = path.read_text(encoding="utf-8")
    header, entries = describe_keys(text)
    relative = f"{conf_dir.parent.name}/{conf_dir.name}/{path.name}"
    lines = [f"## `{relative}`", ""]
    lines += _header_markdown(header)
    if not entries:
        lines.append("No keys.")
    for dotted, depth, value, comment in entries:
        # nested under its section: four spaces a level
        line = "    " * depth + f"- {_code(dotted)}"
        block = value is not None and "\n" in value
        if value is not None and not block:
            line += f" = {_code(value)}"
        if comment:
            line += f" — {_markdown_text(comment)}"
        lines.append(line)
        if block:  # a long list or mapping: YAML under the item
            indent = "    " * (depth + 1)
            lines += [
                f"{indent}```yaml",
                *(indent + row for row in value.splitlines()),
                f"{indent}```",
            ]
    return "\n".join(lines)


def _header_markdown(header: list[str]) -> list[str]:
    """The file's opening comment: one paragraph per block of comment lines (an empty `#`
    line separates them); a block laid out in columns stays a preformatted text block."""
    blocks: list[list[str]] = [[]]
    for line in header:
        if line:
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    out: list[str] = []
    for block in filter(None, blocks):
        if any(re.search(r"\S {2,}\S", line) for line in block):
            out += ["```text", *block, "```", ""]
        else:
            out += [_markdown_text(" ".join(block)), ""]
    return out


def describe_keys(text: str) -> tuple[list[str], list[tuple[str, int, str | None, str]]]:
    """The file's opening comment (the comment lines above the first key that a blank line
    separates from it), and (dotted key, depth, rendered value or None for a section,
    comment) for every mapping key outside lists, in file order."""
    data = yaml.safe_load(text) or {}
    header: list[str] = []
    pending: list[str] = []
    seen_key = False
    stack: list[tuple[int, str]] = []
    entries: list[tuple[str, int, str | None, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            if not seen_key and pending:  # a comment block split from the first key: the file's
                header, pending = header + pending, []
            continue
        if stripped.startswith("#"):
            pending.append(re.sub(r"^#+ ?", "", stripped))  # the layout after "# " is kept
            continue
        match = _KEY_LINE.match(line)
        if match is None:
            pending = []
            continue
        seen_key = True
        indent = len(match["indent"])
        key = match["key"].strip().strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = _lookup(data, [k for _, k in stack])
        if not isinstance(parent, dict) or key not in parent:
            pending = []  # inside a list item or a block scalar
            continue
        rest = match["rest"]
        inline = _INLINE_COMMENT.search(rest)
        value_text = rest[: inline.start()] if inline else rest
        comment = " ".join(
            [c.strip() for c in pending if c.strip()] + ([inline["text"].strip()] if inline else [])
        )
        pending = []
        stack.append((indent, key))
        dotted = ".".join(k for _, k in stack)
        value = parent[key]
        is_section = isinstance(value, dict) and value and not value_text.strip()
        # a value on the key's line as written (1.5e-3 stays 1.5e-3); a block value as YAML
        # writes it on one line
        written = value_text.strip()
        value_shown = written if written and written[0] not in "|>&" else render_value(value)
        entries.append((dotted, len(stack) - 1, None if is_section else value_shown, comment))
    return header, entries


def render_value(value: Any) -> str:
    """A value as YAML writes it on one line (`null`, `true`, `[a, b]`, `{r: 16}`); a list or
    mapping too long for a line as block YAML (several lines)."""
    if isinstance(value, str):
        return value
    dumped = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False)
    one_line = dumped.strip().removesuffix("...").strip()
    if isinstance(value, (list, dict)) and len(one_line) > LONG_VALUE_CHARS:
        return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=88).rstrip()
    return one_line


def _lookup(data: Any, path: list[str]) -> Any:
    node = data
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _code(text: str) -> str:
    """`text` as a Markdown code span, whatever backticks it holds."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _markdown_text(text: str) -> str:
    """A YAML comment as Markdown: code spans kept, `<`, `>` and `&` outside them escaped
    (`<fingerprint>` would otherwise be read as an HTML tag and vanish)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans
        parts = [text.replace("`", "\\`")]
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)
