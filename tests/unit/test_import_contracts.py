"""The layer contracts in pyproject.toml ([tool.importlinter]) hold, and breaking one fails the check."""

from __future__ import annotations

import ast
import json
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
        ("core/policy.py", "from raygate.core.modes import ModeRules", "The core's layers"),  # the config is data
        ("webhook/_scratch.py", "from raygate.reconciler import decision", "The components do not import each other"),
        ("certs/_scratch.py", "from raygate.webhook import decision", "The components do not import each other"),
        ("reconciler/children.py", "from raygate.kube import client", "Pure decisions"),
        ("core/modes/_scratch.py", "import flask", "Pure decisions"),
        ("_scratch.py", "import raygate.core", "Layers"),  # a new module must be placed in a layer
        ("certs/_scratch.py", "from kubernetes import client", "One Kubernetes client"),
    ],
    ids=["core-imports-webhook", "kube-imports-reconciler", "core-imports-a-command", "policy-imports-the-modes",
         "webhook-imports-reconciler", "certs-imports-webhook", "decision-imports-the-client", "mode-imports-flask",
         "unplaced-module", "certs-uses-a-second-client"],
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


# Every import circle among the modules of raygate.core, as the chain from a module back to itself; run where the
# `raygate` on the path is the one under test (not the one this process imported).
CORE_CIRCLES = """
import json, grimp
graph = grimp.build_graph("raygate", cache_dir=None)
core = {m for m in graph.modules if m == "raygate.core" or m.startswith("raygate.core.")}
circles = []
for module in sorted(core):
    for imported in sorted(graph.find_modules_directly_imported_by(module) & core):
        back = graph.find_shortest_chain(importer=imported, imported=module)
        if back is not None:
            circles.append([module, *back])
print(json.dumps(circles))
"""


def core_circles(package_parent: Path) -> list[list[str]]:
    """Import circles in raygate.core, imports made only for typing (under TYPE_CHECKING) included."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    proc = subprocess.run([sys.executable, "-c", CORE_CIRCLES], cwd=package_parent, env=env, capture_output=True,
                          text=True, check=True, timeout=120)
    return list(json.loads(proc.stdout))


def test_the_core_has_no_import_circle() -> None:
    assert core_circles(REPO) == []


def test_a_typing_only_import_back_up_is_a_circle(tmp_path: Path) -> None:
    shutil.copytree(REPO / "raygate", tmp_path / "raygate", ignore=shutil.ignore_patterns("__pycache__"))
    policy = tmp_path / "raygate" / "core" / "policy.py"
    policy.write_text(policy.read_text() + "\nif TYPE_CHECKING:\n    from raygate.core.modes import ModeRules\n")
    circles = core_circles(tmp_path)
    assert ["raygate.core.modes", "raygate.core.policy", "raygate.core.modes"] in circles, circles
