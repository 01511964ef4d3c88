"""The commands in README.md and docs/*.md work as written, and the pages hold together.

Every fenced ``bash`` block carries a marker on the line before it (docs/testing.md, "The
documentation's commands"):

- ``<!-- tested: prints "TEXT" -->``: run here in a fresh working directory laid out like the project;
  it must exit 0 and print every quoted TEXT. Such blocks start no Spark.
- ``<!-- tested slow: prints "TEXT" -->``: the same, in one working directory whose warehouse holds
  the ``orders`` sample table's three dates, written by a real pipeline run.
- ``<!-- tested slow on an empty warehouse: prints "TEXT" -->``: the same, in a working directory of
  its own whose warehouse is empty (a block that runs a table from its first date).
- ``<!-- tested slow on both catalogs: prints "TEXT" -->``: as ``tested slow``, and again with the project
  pointed at a lake (SeaweedFS, its REST catalog; what ``eval "$(make -s lake-env)"`` sets) whose warehouse
  holds the same three dates.
- ``<!-- tested slow on the lake: prints "TEXT" -->``: on that lake only (a reader of REST catalogs).
- ``<!-- not tested: REASON -->``: servers, long runs, syntax only.

A block is run with ``bash -euo pipefail`` and the project's ``.venv/bin`` first on PATH, so a
command that fails anywhere in a block fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cdc_assets.model.config import load_table_config
from tests.lake import LAKE_VARIABLES
from tests.pipeline import definitions_for, run_range

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250
# The environment the commands are written for: the project's virtualenv, which runs this test.
VENV = Path(sys.prefix)

MARKER = re.compile(
    r"^<!--\s*(tested slow on an empty warehouse|tested slow on both catalogs|tested slow on the lake|tested slow|tested|not tested)"
    r"\s*(?::\s*(.*?))?\s*-->$"
)
# A block that starts a table from its first date: on the shared warehouse it would re-run a date that
# later stored dates were computed from, which a run refuses (docs/operations.md).
EMPTY_WAREHOUSE = "tested slow on an empty warehouse"
# A reader whose commands differ by catalog (the embedded one, a lake's REST catalog): run on both.
BOTH_CATALOGS = "tested slow on both catalogs"
ON_THE_LAKE = "tested slow on the lake"
PRINTS = re.compile(r'prints\s+"([^"]+)"')
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)")

# A small command finishes in seconds; one that starts Spark (a JVM of its own) can take minutes on
# a loaded 2-core machine, a dagster CLI run of three dates the longest.
CHEAP_TIMEOUT_SECONDS = 180
SLOW_TIMEOUT_SECONDS = 900
# What the commands' own Spark gets: small, and never a developer's Connect server.
SPARK_CONF = '{"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}'


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page, with the marker on the line before it."""

    page: Path
    line: int  # of the opening fence, from 1
    language: str
    marker: str | None  # "tested", "tested slow", EMPTY_WAREHOUSE, BOTH_CATALOGS, ON_THE_LAKE, "not tested", or None
    note: str
    text: str

    @property
    def expected(self) -> list[str]:
        return PRINTS.findall(self.note)

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        ticks, language = opening.groups()
        end = index + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        marker = MARKER.match(lines[index - 1].strip()) if index > 0 else None
        blocks.append(
            Block(
                page=page,
                line=index + 1,
                language=language,
                marker=marker.group(1) if marker else None,
                note=(marker.group(2) or "") if marker else "",
                text="\n".join(lines[index + 1 : end]) + "\n",
            )
        )
        index = end + 1
    return blocks


def bash_blocks() -> list[Block]:
    return [block for page in PAGES for block in fenced_blocks(page) if block.language == "bash"]


def marked(marker: str) -> list[Block]:
    return [block for block in bash_blocks() if block.marker == marker]


def project_dir(root: Path) -> Path:
    """A working directory laid out as the project's after ``make install``: what the commands expect."""
    (root / ".venv").symlink_to(VENV, target_is_directory=True)
    for name in ("table_configs", "samples", "cdc_assets"):  # cdc_assets: the dg project's defs folder
        (root / name).symlink_to(REPO / name, target_is_directory=True)
    (root / "pyproject.toml").symlink_to(REPO / "pyproject.toml")  # [tool.dg], which dg reads
    home = root / ".dagster_home"
    home.mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    return root


def command_env(project: Path, lake: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment without the project's settings, so the commands see their defaults,
    with this checkout's code first and Spark kept small and local; with ``lake``, the variables that
    point the project at a lake (``make -s lake-env``'s)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SPARK_REMOTE", "CDC_TABLE_CONFIGS", "CDC_SPARK_MASTER", *LAKE_VARIABLES)
    }
    env.update(lake or {})
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["DAGSTER_HOME"] = str(project / ".dagster_home")
    env["CDC_SPARK"] = "local"
    env["CDC_SPARK_CONF"] = SPARK_CONF
    return env


def run_block(block: Block, project: Path, timeout: float, lake: dict[str, str] | None = None) -> str:
    """Run the block's commands in ``project`` (pointed at ``lake`` if given); returns their output, failing
    the test if any command failed."""
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=project,
        env=command_env(project, lake),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout stops the JVMs it started too
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{block.name} ran longer than {timeout} s:\n{block.text}\n{output[-4000:]}")
    assert process.returncode == 0, f"{block.name} exited {process.returncode}:\n{block.text}\n{output[-4000:]}"
    return output


def check_block(block: Block, project: Path, timeout: float, lake: dict[str, str] | None = None) -> None:
    output = run_block(block, project, timeout, lake)
    missing = [text for text in block.expected if text not in output]
    assert not missing, f"{block.name} did not print {missing}:\n{block.text}\n{output[-4000:]}"


# --- the pages' shape ---------------------------------------------------------------------------


def test_readme_fits_in_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_every_bash_block_is_marked():
    blocks = bash_blocks()
    assert any(block.page == README for block in blocks) and any(block.page != README for block in blocks)
    unmarked = [block.name for block in blocks if block.marker is None]
    assert not unmarked, f"bash blocks without <!-- tested ... --> or <!-- not tested: ... -->: {unmarked}"
    silent = [block.name for block in blocks if block.marker != "not tested" and not block.expected]
    assert not silent, f'tested blocks must say what they print (prints "..."): {silent}'
    unexplained = [block.name for block in blocks if block.marker == "not tested" and not block.note]
    assert not unexplained, f"not tested blocks must say why: {unexplained}"
    assert marked("tested") and marked("tested slow") and marked(EMPTY_WAREHOUSE) and marked(BOTH_CATALOGS) and marked(ON_THE_LAKE)


def test_markers_are_on_bash_blocks_only():
    """A marker above something else (a typo'd language, a python block) would be silently ignored."""
    misplaced = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, (line, after) in enumerate(zip(lines, lines[1:] + [""]), 1):
            if MARKER.match(line.strip()) and not after.startswith("```bash"):
                misplaced.append(f"{page.relative_to(REPO)}:{number}")
    assert not misplaced, f"markers not directly above a ```bash fence: {misplaced}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    anchors, seen, in_fence = set(), {}, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        heading = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_relative_links_resolve():
    broken, checked = [], 0
    for page in PAGES:
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            if not destination.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert checked > 50, f"only {checked} relative links found: is the link pattern still right?"
    assert not broken, "\n".join(broken)


def test_readme_config_example_is_the_orders_config():
    """The README's one full example is the shipped table config, field for field."""
    examples = [block for block in fenced_blocks(README) if block.language == "yaml"]
    assert len(examples) == 1
    shipped = REPO / "table_configs" / "orders.yaml"
    assert yaml.safe_load(examples[0].text) == yaml.safe_load(shipped.read_text())
    assert load_table_config(shipped).name == "orders"


# --- the commands -------------------------------------------------------------------------------


@pytest.mark.parametrize("block", marked("tested"), ids=lambda block: block.name)
def test_command_block(block, tmp_path):
    check_block(block, project_dir(tmp_path), CHEAP_TIMEOUT_SECONDS)


@pytest.fixture(scope="module")
def orders_project(spark, tmp_path_factory):
    """A project directory whose warehouse holds the orders sample's 2024-01-01..03, from one real run."""
    project = project_dir(tmp_path_factory.mktemp("readme-orders"))
    patch = pytest.MonkeyPatch()
    patch.setenv("CDC_WAREHOUSE", str(project / "warehouse"))
    patch.setenv("CDC_DATA_ROOT", str(REPO))
    try:
        result = run_range(definitions_for(load_table_config(REPO / "table_configs" / "orders.yaml")), "2024-01-01", "2024-01-03")
        assert result.success
    finally:
        patch.undo()
    return project


@pytest.mark.slow
@pytest.mark.parametrize("block", [*marked("tested slow"), *marked(BOTH_CATALOGS)], ids=lambda block: block.name)
def test_command_block_on_the_orders_warehouse(block, orders_project):
    check_block(block, orders_project, SLOW_TIMEOUT_SECONDS)


@pytest.fixture(scope="module")
def orders_lake(spark, tmp_path_factory):
    """A project directory and a lake of its own (SeaweedFS) whose warehouse holds the orders sample's
    2024-01-01..03, from one real run; yields the directory and the variables that point at the lake."""
    from cdc_assets.engines import lake_server
    from tests.lake import lake_variables, pointed_at, start_lake

    root = tmp_path_factory.mktemp("readme-lake")
    handle = start_lake(root / "lake")
    try:
        variables = {name: value for name, value in lake_variables(handle).items() if name != "CDC_DATA_ROOT"}
        with pytest.MonkeyPatch.context() as patch, pointed_at(patch, variables):
            patch.setenv("CDC_DATA_ROOT", str(REPO))  # the samples' extracts, read from this checkout
            result = run_range(definitions_for(load_table_config(REPO / "table_configs" / "orders.yaml")), "2024-01-01", "2024-01-03")
            assert result.success
        (root / "project").mkdir()
        yield project_dir(root / "project"), variables
    finally:
        lake_server.stop(handle.state_dir)


@pytest.mark.slow
@pytest.mark.lake
@pytest.mark.parametrize("block", [*marked(BOTH_CATALOGS), *marked(ON_THE_LAKE)], ids=lambda block: block.name)
def test_command_block_on_the_orders_lake(block, orders_lake):
    project, variables = orders_lake
    check_block(block, project, SLOW_TIMEOUT_SECONDS, lake=variables)


@pytest.mark.slow
@pytest.mark.parametrize("block", marked(EMPTY_WAREHOUSE), ids=lambda block: block.name)
def test_command_block_on_an_empty_warehouse(block, tmp_path):
    check_block(block, project_dir(tmp_path), SLOW_TIMEOUT_SECONDS)
