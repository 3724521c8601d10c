"""pyproject.toml lists every package the wheel must hold, and maps each component folder to the
name its link in raygate/ gives it (what mypy, import-linter and a checkout import)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


# The workshop: what only the local stack, the demo, the tests and the benchmarks use, left out of the wheel.
WORKSHOP = {"raygate.devenv"}


def test_every_package_in_the_tree_is_listed_for_the_wheel() -> None:
    found = {
        ".".join(Path(root).relative_to(REPO).parts)
        for root, _, files in os.walk(REPO / "raygate", followlinks=True)
        if "__init__.py" in files
    }
    assert found - WORKSHOP == set(SETUPTOOLS["packages"]), "add the new package to [tool.setuptools] packages"
    assert found >= WORKSHOP


def test_each_component_link_matches_the_package_dir_mapping() -> None:
    links = {f"raygate.{p.name}": os.readlink(p) for p in (REPO / "raygate").iterdir() if p.is_symlink()}
    assert links == {name: f"../{folder}" for name, folder in SETUPTOOLS["package-dir"].items()}
    assert set(links) == {"raygate.webhook", "raygate.reconciler", "raygate.certs"}
