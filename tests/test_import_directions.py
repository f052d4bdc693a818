"""The import directions of docs/design.md, read from the source: every ``import`` statement
of the package (module level or inside a function: a lazy import is an arrow too) is checked
against the rooms it may reach.

- ``polydev`` (runtime/) imports nothing of the project outside itself;
- a backend imports the runtime and ``polydev.backends.array`` only, never another backend;
- ``polydev.models`` imports the runtime; its architecture tables (``models/arch``) import
  nothing else of the project, the graph builders (``models/graphs``) read the tables and the
  shared blocks and step (``GRAPH_READS``), and of the rest of the model layer only the
  evaluator imports the builders;
- ``polydev.server`` imports ``polydev.models`` and the runtime;
- ``polydev.tools`` may import everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folders of the repository and the import packages they are (pyproject.toml's package-dir)
FOLDERS = {"runtime": "polydev", "backends": "polydev.backends", "models": "polydev.models",
           "server": "polydev.server", "tools": "polydev.tools"}


def module_name(path: Path) -> str:
    """``models/arch/table.py`` -> ``polydev.models.arch.table``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join([FOLDERS[parts[0]], *parts[1:]])
    return name.removesuffix(".__init__")


def imported(path: Path) -> set[str]:
    """Every ``polydev`` module the file at ``path`` imports."""
    return imports_of(module_name(path), path.name == "__init__.py", path.read_text())


def imports_of(module: str, is_package: bool, source: str) -> set[str]:
    """Every ``polydev`` module (or name in one) that ``source``, the text of ``module``,
    imports, relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "polydev" or n.startswith("polydev.")}


def room(name: str) -> str:
    """The room a module is in: ``polydev`` (the runtime), ``polydev.backends.<vendor>``,
    ``polydev.models.arch`` (the tables), ``polydev.models.graphs`` (the builders),
    ``polydev.models``, ``polydev.server`` or ``polydev.tools``."""
    parts = name.split(".")
    if name.startswith("polydev.backends.") and len(parts) > 2:
        return ".".join(parts[:3])
    for inner in ("polydev.models.arch", "polydev.models.graphs"):
        if name == inner or name.startswith(inner + "."):
            return inner
    for top in ("polydev.backends", "polydev.models", "polydev.server", "polydev.tools"):
        if name == top or name.startswith(top + "."):
            return top
    return "polydev"


# the rooms each room may import besides itself
ALLOWED = {
    "polydev": set(),
    "polydev.backends": {"polydev"},
    "polydev.backends.array": {"polydev"},
    "polydev.models.arch": {"polydev"},
    "polydev.models.graphs": {"polydev", "polydev.models.arch"},
    "polydev.models": {"polydev", "polydev.models.arch"},
    "polydev.server": {"polydev", "polydev.models", "polydev.models.arch"},
}


# what the graph builders read of the rest of the model layer: the shared blocks and the step
GRAPH_READS = ("polydev.models.layers", "polydev.models.step", "polydev.models.kv_shift",
               "polydev.models.hparams")


def reaches(importer: str, name: str, reach: set[str]) -> bool:
    """Whether a module of room ``importer`` may import ``name`` (a module, or a name in
    one), ``reach`` being the rooms it may import."""
    if room(name) == importer or room(name) in reach:
        return True
    return importer == "polydev.models.graphs" and any(
        name == module or name.startswith(module + ".") for module in GRAPH_READS)


def allowed(importer: str, module: str = "") -> set[str] | None:
    """The rooms ``importer``'s room (``module`` in it) may reach (None: anything, the command
    line's tools)."""
    if importer == "polydev.tools":
        return None
    if module == "polydev.models.evaluator":        # the one that runs the graph builders
        return ALLOWED[importer] | {"polydev.models.graphs"}
    if importer.startswith("polydev.backends."):
        return {"polydev", "polydev.backends.array", "polydev.backends"}
    return ALLOWED[importer]


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_the_rooms_cover_every_source_file():
    assert len(sources()) > 100
    assert module_name(ROOT / "runtime" / "ops" / "matmul.py") == "polydev.ops.matmul"
    assert module_name(ROOT / "models" / "arch" / "__init__.py") == "polydev.models.arch"


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_the_designed_way(path):
    importer = room(module_name(path))
    reach = allowed(importer, module_name(path))
    if reach is None:
        return
    wrong = sorted(name for name in imported(path) if not reaches(importer, name, reach))
    assert not wrong, f"{importer} may import only {sorted(reach) or 'itself'}, not {wrong}"


def test_the_check_sees_a_wrong_arrow():
    """The walk resolves relative imports and finds imports inside functions."""
    source = "def f():\n    from .ops import add\n    import polydev.models\n"
    found = imports_of("polydev.probe", False, source)
    assert found == {"polydev.ops", "polydev.ops.add", "polydev.models"}
    assert room("polydev.models") not in allowed(room("polydev.probe"))
    assert imports_of("polydev.models.arch", True, "from ..layers import norm") == {
        "polydev.models.layers", "polydev.models.layers.norm"}
    graphs = allowed("polydev.models.graphs")
    assert reaches("polydev.models.graphs", "polydev.models.layers.norm", graphs)
    assert not reaches("polydev.models.graphs", "polydev.models.engine.BatchEngine", graphs)
