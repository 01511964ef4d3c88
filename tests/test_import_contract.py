"""The import contract: the layers of ``cdc_assets`` and ``resources``, lowest first, and the rules their
imports keep. Imports are read from the source (every ``import``, those inside functions too; those under
``if TYPE_CHECKING:`` are for the type checker only and do not count).

1. A module imports modules of its own layer or lower ones, never a higher one.
2. No two modules import each other, directly or through others.
3. Below the Dagster layers, nothing imports Dagster; the model imports neither Dagster nor Spark.
4. The reading commands (``cdc-current``, ``cdc-scd2``, ``cdc-changes``, ``cdc-catalog``, the report) load no
   Dagster, through any module they import (a package's ``__init__`` runs on the import of its modules).

A new module must be placed in a layer here: the test names it until it is.
"""

from __future__ import annotations

import ast
import fnmatch
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("cdc_assets", "resources")

# Lowest first. Each pattern names modules (fnmatch); a package is named by its own name (its __init__).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("model", ("cdc_assets", "cdc_assets.model", "cdc_assets.model.*")),
    ("core", ("cdc_assets.core", "cdc_assets.core.*")),
    ("engines", ("cdc_assets.engines", "cdc_assets.engines.*")),
    ("storage", ("resources.storage", "resources.storage.*")),
    ("sessions", ("resources.session", "resources.session.*")),
    ("use cases", ("cdc_assets.usecases", "cdc_assets.usecases.*")),
    ("dagster resources", ("resources", "resources.fields", "resources.spark", "resources.parquet_io_manager", "resources.alerts")),
    ("dagster definitions", ("cdc_assets.defs", "cdc_assets.defs.*")),
    ("commands and servers", ("cdc_assets.cli", "cdc_assets.cli.*")),
]
DAGSTER_FREE_BELOW = "dagster resources"  # this layer and those above may import Dagster
DAGSTER = ("dagster", "dagster_pyspark", "dagster_webserver")
SPARK = ("pyspark",)
READING_COMMANDS = ("cdc_assets.cli.read", "cdc_assets.cli.catalog", "cdc_assets.cli.report")


@dataclass(frozen=True)
class Imports:
    """What one module imports: modules of the project, by name, and the top-level names of other packages."""

    internal: frozenset[str]
    external: frozenset[str]


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every import statement, inside functions too, but not under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        for child in ast.iter_child_nodes(node):
            if not _type_checking_only(child):
                stack.append(child)


def read_imports(root: Path) -> dict[str, Imports]:
    known = modules(root)

    def internal(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in known.items():
        inside, outside = set(), set()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:  # relative: from its package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names = [f"{base}.{node.module}" if node.module else base]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = [alias.name for alias in node.names]
            if isinstance(node, ast.ImportFrom):  # `from package import module` imports the module, not the package's names
                submodules = [f"{names[0]}.{alias.name}" for alias in node.names if f"{names[0]}.{alias.name}" in known]
                names = submodules if len(submodules) == len(node.names) else names + submodules
            for name in names:
                target = internal(name)
                if target is not None:
                    inside.add(target)
                elif name.split(".")[0] not in PACKAGES:
                    outside.add(name.split(".")[0])
        inside.discard(module)
        graph[module] = Imports(frozenset(inside), frozenset(outside))
    return graph


def layer_of(module: str) -> int | None:
    placed = [index for index, (_, patterns) in enumerate(LAYERS) if any(fnmatch.fnmatchcase(module, p) for p in patterns)]
    # A name may match a wildcard of one layer and be named exactly in another: the exact name wins.
    exact = [index for index, (_, patterns) in enumerate(LAYERS) if module in patterns]
    return (exact or placed or [None])[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _with_packages(module: str) -> list[str]:
    """The module and the packages above it, whose ``__init__`` Python runs first."""
    parts = module.split(".")
    return [".".join(parts[: end]) for end in range(1, len(parts) + 1)]


def contract_violations(root: Path) -> list[str]:
    """Every breach of the contract in the tree under ``root``, as sentences."""
    graph = read_imports(root)
    problems = [f"{module} is in no layer: place it in LAYERS ({__file__})" for module in graph if layer_of(module) is None]
    names = [name for name, _ in LAYERS]
    free_below = names.index(DAGSTER_FREE_BELOW)
    for module, imports in sorted(graph.items()):
        own = layer_of(module)
        if own is None:
            continue
        for target in sorted(imports.internal):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                problems.append(f"{module} ({names[own]}) imports {target} ({names[theirs]}), a higher layer")
        if own < free_below and imports.external & set(DAGSTER):
            problems.append(f"{module} ({names[own]}) imports Dagster ({', '.join(sorted(imports.external & set(DAGSTER)))})")
        if own == 0 and imports.external & set(SPARK):
            problems.append(f"{module} (model) imports Spark")
    problems += [f"import cycle: {' <-> '.join(cycle)}" for cycle in _cycles({m: set(i.internal) for m, i in graph.items()})]
    # What a command loads: its imports, their packages' __init__s, and theirs, all the way down.
    loads = {m: {p for target in i.internal for p in _with_packages(target) if p in graph} for m, i in graph.items()}
    for command in READING_COMMANDS:
        seen, todo = set(), [command]
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(loads.get(module, ()))
        via = sorted(m for m in seen if graph[m].external & set(DAGSTER))
        if via:
            problems.append(f"{command} loads Dagster, through {', '.join(via)}")
    return problems


def test_the_imports_keep_the_layers_and_no_cycle_and_the_reading_commands_load_no_dagster():
    assert contract_violations(REPO) == []


def test_the_contract_catches_an_upward_import_a_cycle_and_dagster_in_a_reading_command(tmp_path):
    """A copy of the tree with three planted breaches: the check names each."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    hashing = tmp_path / "cdc_assets" / "core" / "hashing.py"
    # A lazy import, inside a function, counts as any other.
    hashing.write_text(hashing.read_text() + "\n\ndef _planted():\n    from cdc_assets.defs.factory import build_table_definitions\n")
    columns = tmp_path / "cdc_assets" / "core" / "columns.py"
    columns.write_text(columns.read_text() + "\nfrom cdc_assets.core.hashing import key_hash\n")  # hashing imports columns
    consumers = tmp_path / "cdc_assets" / "usecases" / "readers.py"
    consumers.write_text(consumers.read_text() + "\nfrom cdc_assets.defs.asset_keys import asset_key\n")

    problems = contract_violations(tmp_path)
    assert "cdc_assets.core.hashing (core) imports cdc_assets.defs.factory (dagster definitions), a higher layer" in problems
    assert any(p.startswith("import cycle:") and "cdc_assets.core.columns" in p and "cdc_assets.core.hashing" in p for p in problems), problems
    assert "cdc_assets.usecases.readers (use cases) imports cdc_assets.defs.asset_keys (dagster definitions), a higher layer" in problems
    assert any(p.startswith("cdc_assets.cli.read loads Dagster, through") and "cdc_assets.defs.asset_keys" in p for p in problems), problems
