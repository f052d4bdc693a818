"""pyproject.toml's package list against the source tree: an editable install finds every
module through the folders, but a wheel holds only the packages listed, so a package left out
of the list breaks ``pip install .`` alone (as polydev.models.arch once did)."""

from __future__ import annotations

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
