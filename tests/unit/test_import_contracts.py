"""The layer contracts in pyproject.toml ([tool.importlinter]) hold, and breaking one fails the check."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """Run the contracts against the `raygate` package found in `package_parent`."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(REPO / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=package_parent, env=env, capture_output=True, text=True, check=False, timeout=120,
    )


def test_the_contracts_hold() -> None:
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("scratch", "imports", "broken"),
    [
        ("core/_scratch.py", "from raygate.webhook import decision", "Layers"),
        ("kube/_scratch.py", "import raygate.reconciler.controller", "Layers"),
        ("core/_scratch.py", "from raygate import cli", "Layers"),
        ("webhook/_scratch.py", "from raygate.reconciler import decision", "The components do not import each other"),
        ("certs/_scratch.py", "from raygate.webhook import registration", "The components do not import each other"),
        ("reconciler/children.py", "from raygate.kube import client", "Pure decisions"),
        ("core/modes/_scratch.py", "import flask", "Pure decisions"),
        ("_scratch.py", "import raygate.core", "Layers"),  # a new module must be placed in a layer
        ("certs/_scratch.py", "from kubernetes import client", "One Kubernetes client"),
    ],
    ids=["core-imports-webhook", "kube-imports-reconciler", "core-imports-a-command", "webhook-imports-reconciler",
         "certs-imports-webhook", "decision-imports-the-client", "mode-imports-flask", "unplaced-module",
         "certs-uses-a-second-client"],
)
def test_an_import_against_the_layers_fails_the_check(tmp_path: Path, scratch: str, imports: str,
                                                      broken: str) -> None:
    # A copy of the package (the component links resolved), so the tree under test is never touched.
    shutil.copytree(REPO / "raygate", tmp_path / "raygate", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "raygate" / scratch
    target.write_text((target.read_text() if target.exists() else "") + f"\n{imports}\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    broken_lines = proc.stdout[proc.stdout.index("Broken contracts"):]
    assert broken in broken_lines, proc.stdout


def test_no_code_imports_a_component_by_its_folder_name() -> None:
    """`import webhook` works from a checkout (the folder is on the path) but not from the wheel."""
    bad = []
    for folder in ("raygate", "webhook", "reconciler", "certs", "tests", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                bad += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                        if n.split(".")[0] in ("webhook", "reconciler", "certs")]
    assert not bad, "import these as raygate.<component>: " + ", ".join(bad)
