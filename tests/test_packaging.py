"""pyproject.toml's package list against the source tree: an editable install finds every
module through the folders, but a wheel holds only the packages listed, so a package left out
of the list breaks ``pip install .`` alone (as polydev.models.arch once did)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")          # Python 3.11 and later

ROOT = Path(__file__).resolve().parent.parent


def _setuptools_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _packages_in_tree(package_dir: dict[str, str]) -> set[str]:
    """Every mapped folder (some hold only data: kernel sources) and every folder with an
    __init__.py under one, named as the install names it."""
    found = {package for package, folder in package_dir.items() if (ROOT / folder).is_dir()}
    for package, folder in package_dir.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *relative]))
    return found


def test_every_package_in_the_tree_is_listed():
    config = _setuptools_config()
    in_tree = _packages_in_tree(config["package-dir"])
    listed = set(config["packages"])
    assert in_tree - listed == set(), "packages missing from [tool.setuptools] packages"
    assert listed - in_tree == set(), "listed packages that are no folder of the tree"


@pytest.mark.parametrize("module,names", [
    ("polydev.models", ["GGUFFile", "GGUFTensorInfo", "StringArray", "Tokenizer", "Vocab"]),
    ("polydev.models.gguf", ["GGUFFile", "GGUFTensorInfo", "StringArray", "GGUFValueType",
                             "TokenType", "GGUF_MAGIC", "DEFAULT_ALIGNMENT"]),
    ("polydev.models.tokenizer", ["Tokenizer", "Vocab"]),
])
def test_the_model_layers_public_imports_stay(module, names):
    """The tokenizer and GGUF files moved into folders of their own; what users import did
    not move."""
    imported = importlib.import_module(module)
    assert [n for n in names if not hasattr(imported, n)] == []
