"""The documentation: the site builds with no warning, the configuration reference is generated
from conf/base, and every command block marked runnable in README.md and docs/*.md runs.

A block is marked runnable by an HTML comment on the line right above its fence:
`<!-- runnable -->` (quick, run by every test session) or `<!-- runnable slow -->` (takes a
minute or more; marked slow). A ```bash block runs with bash, stopping at the first failing
line; a ```python block with this environment's Python. Each runs in a copy of the project,
offline, with this environment's scripts first on PATH, in the state the marker names after
a colon:

- none: a checkout before any run (its configuration, no data);
- `after make run`: the splits prepared and a trained Conductor registered as
  `conductor@champion`, as `make run` leaves them (shared by every such block; the trained
  adapter is the one the tests keep, registered by training's own code, see
  tests/after_make_run.py);
- `after make run, conductor serve running`: that, with `conductor serve` started on a free
  port; the block's `127.0.0.1:8700` is replaced by the port the server took.

A block repeated elsewhere with the same commands (comments aside) runs once, under the name
of its first place. A block fails when its output carries the sandbox's note that a question
is not one of its prepared tasks: the docs ask questions the sandbox answers for real.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from conductor_pipeline.offline import OFFLINE_DEFAULTS

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*runnable(?P<slow>\s+slow)?(?:\s*:\s*(?P<state>[^>]*?))?\s*-->\s*$")
LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
AFTER_MAKE_RUN = "after make run"
SERVED = "after make run, conductor serve running"
STATES = ("", AFTER_MAKE_RUN, SERVED)
# the address the docs give `conductor serve`'s API; a served block gets the real one
SERVED_ADDRESS = "127.0.0.1:8700"
FENCE = re.compile(r"^(?P<fence>`{3,})(?P<info>[^`]*)$")
# the environment the Makefile exports: nothing reaches beyond 127.0.0.1
OFFLINE_ENV = {**OFFLINE_DEFAULTS, "NO_MKDOCS_2_WARNING": "1"}


@dataclass(frozen=True)
class RunnableBlock:
    path: Path
    line: int  # of the marker, 1-based
    code: str
    slow: bool
    language: str = "bash"
    state: str = ""  # one of STATES

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def commands(self) -> tuple[str, str, str]:
        """What the block runs, where: its language, state and lines without comments."""
        lines = (re.sub(r"(^|\s+)#.*$", "", line).rstrip() for line in self.code.splitlines())
        return self.language, self.state, "\n".join(line for line in lines if line)


def runnable_blocks(path: Path) -> list[RunnableBlock]:
    """The blocks of `path` marked runnable; a marker not followed by a bash or python block,
    naming an unknown state, or a block never closed, is an error naming the place."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for index, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if marker is None:
            continue
        where = f"{path.relative_to(REPO)}:{index + 1}"
        state = " ".join((marker["state"] or "").split())
        if state not in STATES:
            known = ", ".join(repr(known) for known in STATES[1:])
            raise ValueError(f"{where}: unknown state {state!r} after `runnable` (known: {known})")
        opening = FENCE.match(lines[index + 1].strip()) if index + 1 < len(lines) else None
        if opening is None or opening["info"].strip() not in LANGUAGES:
            raise ValueError(
                f"{where}: a runnable marker must sit right above a ```bash or ```python block"
            )
        fence = opening["fence"]
        for end in range(index + 2, len(lines)):
            if lines[end].strip() == fence:
                break
        else:
            raise ValueError(f"{where}: the runnable block is never closed")
        code = "\n".join(lines[index + 2 : end])
        language = LANGUAGES[opening["info"].strip()]
        blocks.append(RunnableBlock(path, index + 1, code, bool(marker["slow"]), language, state))
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in runnable_blocks(path)]


def distinct(blocks: list[RunnableBlock]) -> dict[RunnableBlock, list[RunnableBlock]]:
    """Each block whose commands no earlier block runs, with the blocks that repeat them."""
    first: dict[tuple[str, str, str], RunnableBlock] = {}
    places: dict[RunnableBlock, list[RunnableBlock]] = {}
    for block in blocks:
        if block.commands in first:
            places[first[block.commands]].append(block)
        else:
            first[block.commands] = block
            places[block] = [block]
    return places


RUNS = distinct(ALL_BLOCKS)


def _params(blocks) -> list:
    return [
        pytest.param(block, id=block.name, marks=[pytest.mark.slow] if block.slow else [])
        for block in blocks
    ]


def _copy_project(root: Path) -> Path:
    """The project as a reader's checkout has it before any run: its configuration, Makefile
    and the adapter the tests keep; the package itself is this environment's install."""
    root.mkdir()
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy(REPO / name, root)
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    (root / "src").mkdir()
    fixture = Path("tests") / "fixtures" / "champion_adapter"
    shutil.copytree(REPO / fixture, root / fixture)
    return root


def _environment(root: Path, *, language: str = "bash") -> dict[str, str]:
    # no API key (the docs' examples call the server without one), no other project root
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_", "KEDRO_"))
        and k not in ("CONDUCTOR_API_KEY", "CONDUCTOR_PROJECT_ROOT")
    }
    env.update(OFFLINE_ENV)
    if language == "bash":
        env["CONDUCTOR_PROJECT_ROOT"] = str(root)
    # else Python finds the project from its working directory, as the docs say it does
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _check(done: subprocess.CompletedProcess, what: str) -> None:
    assert done.returncode == 0, (
        f"{what} exited {done.returncode}:\n"
        f"--- stdout (end) ---\n{done.stdout[-3000:]}\n--- stderr (end) ---\n{done.stderr[-3000:]}"
    )


@pytest.fixture
def project_copy(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the copy's own store
    return _copy_project(tmp_path / "project")


@pytest.fixture(scope="module")
def after_make_run(tmp_path_factory) -> Path:
    """A project copy as `make run` leaves it, as far as the docs' commands need: the splits
    (the data_prep pipeline) and the trained adapter the tests keep, registered as
    `conductor@champion` (tests/after_make_run.py)."""
    root = _copy_project(tmp_path_factory.mktemp("after-make-run") / "project")
    env = _environment(root)
    for what, command in (
        (
            "kedro run --pipelines data_prep",
            [sys.executable, "-m", "kedro", "run", "--pipelines", "data_prep"],
        ),
        ("registering the champion", [sys.executable, str(REPO / "tests" / "after_make_run.py")]),
    ):
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=600
        )
        _check(done, what)
    return root


@contextlib.contextmanager
def _conductor_serve(root: Path, log: Path) -> Iterator[str]:
    """`conductor serve` in `root` on a free port, healthy; yields its host:port."""
    with log.open("w") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "conductor_pipeline.cli", "serve", "--port", "0"],
            cwd=root,
            env=_environment(root),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and server.poll() is None:
            found = re.search(r"Conductor API on http://(\S+?)/v1", log.read_text())
            if found:
                address = found[1]
                try:
                    if httpx.get(f"http://{address}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
            time.sleep(0.5)
        else:
            pytest.fail(f"conductor serve did not become healthy:\n{log.read_text()[-3000:]}")
        yield address
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# -- the runnable blocks ------------------------------------------------------------------


def test_the_docs_mark_commands_runnable():
    quick = [block.name for block in ALL_BLOCKS if not block.slow]
    assert len(quick) >= 4, f"runnable blocks found: {quick}"
    assert any(block.path.name == "README.md" for block in ALL_BLOCKS)
    after = [block for block in ALL_BLOCKS if block.state]
    assert {block.language for block in after} == {"bash", "python"}, after
    assert any(block.state == SERVED for block in after), after


def test_a_misplaced_marker_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\n\nconductor --help\n")
    with pytest.raises(ValueError, match=r"page.md:1: a runnable marker must sit right above"):
        runnable_blocks(page)
    page.write_text("<!-- runnable -->\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match=r"page.md:1: a runnable marker must sit right above"):
        runnable_blocks(page)
    page.write_text("text\n<!-- runnable slow -->\n```bash\nconductor --help\n")
    with pytest.raises(ValueError, match=r"page.md:2: the runnable block is never closed"):
        runnable_blocks(page)
    page.write_text("<!-- runnable slow: after make test -->\n```bash\nmake help\n```\n")
    with pytest.raises(ValueError, match=r"page.md:1: unknown state 'after make test'"):
        runnable_blocks(page)
    page.write_text("<!-- runnable slow -->\n```bash\nmake help\n```\n")
    assert runnable_blocks(page) == [RunnableBlock(page, 1, "make help", slow=True)]


def test_a_marker_names_the_state_and_the_language(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- runnable slow: after make run -->\n```python\nimport mlflow\n```\n\n"
        "<!--runnable slow:  after make run,  conductor serve running-->\n```sh\ntrue\n```\n"
    )
    assert runnable_blocks(page) == [
        RunnableBlock(page, 1, "import mlflow", True, "python", AFTER_MAKE_RUN),
        RunnableBlock(page, 6, "true", True, "bash", SERVED),
    ]


def test_a_block_repeated_elsewhere_runs_once(tmp_path):
    def block(line: int, code: str, state: str = AFTER_MAKE_RUN) -> RunnableBlock:
        return RunnableBlock(tmp_path / "page.md", line, code, True, "bash", state)

    first = block(1, "conductor ask --sample   # a prepared question\n\nconductor --help")
    again = block(9, "# the same\nconductor ask --sample  # another comment\nconductor --help")
    elsewhere = block(20, first.code, state="")
    other = block(30, "conductor ask --sample --json")
    assert distinct([first, again, elsewhere, other]) == {
        first: [first, again],
        elsewhere: [elsewhere],
        other: [other],
    }


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("block", _params(RUNS))
def test_a_runnable_block_runs(block: RunnableBlock, request):
    from conductor_pipeline.workers.sandbox.questions import UNKNOWN_QUESTION_WARNING

    places = ", ".join(place.name for place in RUNS[block])
    if not block.state:
        root = request.getfixturevalue("project_copy")
    else:
        root = request.getfixturevalue("after_make_run")
    code = block.code
    log = request.getfixturevalue("tmp_path") / "serve.log"
    with contextlib.ExitStack() as stack:
        if block.state == SERVED:
            assert SERVED_ADDRESS in code, f"{places}: a served block calls {SERVED_ADDRESS}"
            code = code.replace(SERVED_ADDRESS, stack.enter_context(_conductor_serve(root, log)))
        if block.language == "bash":
            command = ["bash", "-e", "-o", "pipefail", "-c", code]
        else:
            command = [sys.executable, "-c", code]
        result = subprocess.run(
            command,
            cwd=root,
            env=_environment(root, language=block.language),
            capture_output=True,
            text=True,
            timeout=840 if block.slow else 180,
        )
    _check(result, f"{places}:\n{block.code}\n")
    # the docs ask the sandbox questions it knows; any other gets a made-up answer
    output = result.stdout + result.stderr + (log.read_text() if log.is_file() else "")
    assert UNKNOWN_QUESTION_WARNING[:60] not in output, (
        f"{places} asks a question that is not one of the sandbox's prepared tasks:\n{output[-3000:]}"
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


def test_the_training_page_gives_the_warm_starts_shape_weights_of_conf_base():
    """docs/training.md states the share of each warm-start shape; it said 25/40/35 % (the
    settings' class defaults) while conf/base weighs 15/25/60 %."""
    training = yaml.safe_load((REPO / "conf/base/parameters_training.yml").read_text())
    shapes = training["training"]["sft"]["shapes"]
    text = " ".join((REPO / "docs" / "training.md").read_text(encoding="utf-8").split())
    section = text[text.index("## What the sandbox trains") : text.index("2. **GRPO.**")]
    total = sum(shapes.values())
    for shape, weight in shapes.items():
        stated = re.search(rf"`{shape}` \([^%]*?(\d+) %\)", section)
        assert stated, f"docs/training.md gives no share for the {shape} shape"
        assert int(stated.group(1)) == round(100 * weight / total), shape
