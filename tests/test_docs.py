"""The documentation: the site builds with no warning, the configuration reference is generated
from conf/base, and every command block marked runnable in README.md and docs/*.md runs.

A block is marked runnable by an HTML comment on the line right above its fence:
`<!-- runnable -->` (quick, run by every test session) or `<!-- runnable slow -->` (takes a
minute or more; marked slow). Each block runs with bash, stopping at the first failing line,
in a copy of the project (its configuration, no data), offline, with this environment's
scripts first on PATH.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*runnable(?P<slow>\s+slow)?\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>`{3,})(?P<info>[^`]*)$")
# the environment the Makefile exports: nothing reaches beyond 127.0.0.1
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "KEDRO_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "NO_MKDOCS_2_WARNING": "1",
}


@dataclass(frozen=True)
class RunnableBlock:
    path: Path
    line: int  # of the marker, 1-based
    code: str
    slow: bool

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def runnable_blocks(path: Path) -> list[RunnableBlock]:
    """The blocks of `path` marked runnable; a marker not followed by a bash block, or a block
    never closed, is an error naming the place."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for index, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if marker is None:
            continue
        where = f"{path.relative_to(REPO)}:{index + 1}"
        opening = FENCE.match(lines[index + 1].strip()) if index + 1 < len(lines) else None
        if opening is None or opening["info"].strip() not in ("bash", "sh", "shell"):
            raise ValueError(f"{where}: a runnable marker must sit right above a ```bash block")
        fence = opening["fence"]
        for end in range(index + 2, len(lines)):
            if lines[end].strip() == fence:
                break
        else:
            raise ValueError(f"{where}: the runnable block is never closed")
        code = "\n".join(lines[index + 2 : end])
        blocks.append(RunnableBlock(path, index + 1, code, slow=bool(marker["slow"])))
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in runnable_blocks(path)]


def _params(blocks: list[RunnableBlock]) -> list:
    return [
        pytest.param(block, id=block.name, marks=[pytest.mark.slow] if block.slow else [])
        for block in blocks
    ]


@pytest.fixture
def project_copy(tmp_path, monkeypatch) -> Path:
    """The project as a reader's checkout has it before any run: its configuration, Makefile
    and the adapter the tests keep; the package itself is this environment's install."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy(REPO / name, root)
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    (root / "src").mkdir()
    fixture = Path("tests") / "fixtures" / "champion_adapter"
    shutil.copytree(REPO / fixture, root / fixture)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the copy's own store
    return root


def _environment(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KEDRO_"))}
    env.update(OFFLINE_ENV)
    env["CONDUCTOR_PROJECT_ROOT"] = str(root)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


# -- the runnable blocks ------------------------------------------------------------------


def test_the_docs_mark_commands_runnable():
    quick = [block.name for block in ALL_BLOCKS if not block.slow]
    assert len(quick) >= 4, f"runnable blocks found: {quick}"
    assert any(block.path.name == "README.md" for block in ALL_BLOCKS)


def test_a_misplaced_marker_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\n\nconductor --help\n")
    with pytest.raises(ValueError, match=r"page.md:1: a runnable marker must sit right above"):
        runnable_blocks(page)
    page.write_text("text\n<!-- runnable slow -->\n```bash\nconductor --help\n")
    with pytest.raises(ValueError, match=r"page.md:2: the runnable block is never closed"):
        runnable_blocks(page)
    page.write_text("<!-- runnable slow -->\n```bash\nmake help\n```\n")
    assert runnable_blocks(page) == [RunnableBlock(page, 1, "make help", slow=True)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", _params(ALL_BLOCKS))
def test_a_runnable_block_runs(block: RunnableBlock, project_copy: Path):
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.code],
        cwd=project_copy,
        env=_environment(project_copy),
        capture_output=True,
        text=True,
        timeout=840 if block.slow else 180,
    )
    assert result.returncode == 0, (
        f"{block.name} exited {result.returncode}:\n{block.code}\n"
        f"--- stdout (end) ---\n{result.stdout[-3000:]}\n--- stderr (end) ---\n{result.stderr[-3000:]}"
    )


# -- the site -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, **OFFLINE_ENV}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
    assert result.returncode == 0 and not warnings, f"mkdocs build --strict:\n{output}"
    return site


def test_the_site_builds_strictly_and_offline(built_site: Path):
    pages = sorted(built_site.glob("**/index.html"))
    assert len(pages) >= 16
    for page in pages:
        html = page.read_text(encoding="utf-8")
        # no web fonts, scripts or stylesheets from elsewhere: the site works offline
        external = re.findall(r"<(?:link|script|img)[^>]+(?:href|src)=\"(https?://[^\"]+)\"", html)
        assert not external, f"{page.relative_to(built_site)} loads {external}"
        assert "fonts.googleapis" not in html


def test_the_configuration_reference_holds_every_file_and_the_values_of_conf_base(built_site):
    html = (built_site / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "config-reference" not in html  # the marker was replaced
    for path in sorted((REPO / "conf" / "base").glob("*.yml")):
        assert f"conf/base/{path.name}" in html
    training = yaml.safe_load((REPO / "conf/base/parameters_training.yml").read_text())
    steps = training["training"]["grpo"]["max_steps"]
    assert re.search(rf"training\.grpo\.max_steps</code> = <code>{steps}</code>", html)


def _hook():
    spec = importlib.util.spec_from_file_location(
        "config_reference", REPO / "docs" / "hooks" / "config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_takes_each_key_with_its_value_and_comment():
    header, entries = _hook().describe_keys(
        "# What this file is.\n"
        "\n"
        "# the section\n"
        "training:\n"
        "  # how many steps\n"
        "  # of GRPO\n"
        "  max_steps: 16     # 512 rollouts\n"
        "  learning_rate: 1.5e-3\n"
        "  lora: {r: 16, alpha: 32}\n"
        "  workers:\n"
        "    - name: a    # inside a list: part of the list's value\n"
        "      model: x\n"
        "  text: |\n"
        "    key: not a key\n"
        "url: http://127.0.0.1:8000/v1#anchor\n"
    )
    assert header == ["What this file is."]
    assert entries == [
        ("training", 0, None, "the section"),
        ("training.max_steps", 1, "16", "how many steps of GRPO 512 rollouts"),
        ("training.learning_rate", 1, "1.5e-3", ""),
        ("training.lora", 1, "{r: 16, alpha: 32}", ""),
        ("training.workers", 1, "[{name: a, model: x}]", ""),
        ("training.text", 1, "key: not a key\n", ""),
        ("url", 0, "http://127.0.0.1:8000/v1#anchor", ""),
    ]
