"""The wheel the image is built from: built from exactly the files the Dockerfile copies, installed into
a fresh virtualenv with its dependencies, and run through the commands the Deployments run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]


def builder_sources(dockerfile: Path) -> list[str]:
    """The paths the Dockerfile's first (builder) stage COPYs from the build context."""
    sources: list[str] = []
    stage = 0
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words:
            continue
        instruction = words[0].upper()
        if instruction == "FROM":
            stage += 1
        elif instruction == "COPY" and stage == 1 and not any(w.startswith("--from") for w in words):
            sources += [w.rstrip("/") for w in words[1:-1] if not w.startswith("--")]
    return sources


def _run(argv: list[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    context = tmp_path_factory.mktemp("context")
    sources = builder_sources(REPO / "Dockerfile")
    assert "pyproject.toml" in sources, sources
    for src in sources:
        path = REPO / src
        if path.is_dir():
            shutil.copytree(path, context / src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, context / src)
    dist = tmp_path_factory.mktemp("dist")
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", dist, "."], cwd=context)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = list(dist.glob("raygate-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    proc = _run([sys.executable, "-m", "venv", venv], cwd=venv)
    assert proc.returncode == 0, proc.stderr
    # Dependencies come from the package index (pip's cache makes repeat runs fast).
    proc = _run([venv / "bin" / "python", "-m", "pip", "install", wheel], cwd=venv, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv / "bin"


def test_wheel_holds_every_package_and_the_console_scripts(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = zf.read(entry_points).decode()
    top = {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info" not in n}
    assert top == {"raygate"}, "the wheel must install one top-level name (webhook/ etc. as raygate.webhook)"
    for component in ("webhook", "reconciler", "certs"):
        assert f"raygate/{component}/__init__.py" in names, component
    assert "raygate/core/modes/__init__.py" in names
    assert "raygate/py.typed" in names
    assert "raygate = raygate.cli:main" in scripts
    assert not any(n.startswith("tests/") for n in names)


def test_installed_code_comes_from_the_wheel(venv_bin: Path, tmp_path: Path) -> None:
    code = "import raygate.webhook, raygate.reconciler, raygate.certs; print(raygate.__file__)"
    proc = _run([venv_bin / "python", "-c", code], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(str(venv_bin.parent)), proc.stdout


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([], ["webhook", "reconciler", "certs"]),
        (["webhook"], ["--port", "--tls-cert-file", "--tls-key-file"]),
        (["reconciler"], ["--leader-elect", "--metrics-port"]),
        (["certs", "ensure"], []),
    ],
    ids=["raygate", "webhook", "reconciler", "certs-ensure"],
)
def test_help(venv_bin: Path, tmp_path: Path, command: list[str], expected: list[str]) -> None:
    proc = _run([venv_bin / "raygate", *command, "--help"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # argparse exits on --help before it rejects an unknown subcommand, so exit 0 alone proves
    # nothing: the usage line must name the whole command.
    usage = " ".join(["usage: raygate", *command])
    assert proc.stdout.startswith(f"{usage} "), f"expected {usage!r}:\n{proc.stdout}"
    missing = [flag for flag in expected if flag not in proc.stdout]
    assert not missing, f"`raygate {' '.join(command)} --help` does not mention {missing}:\n{proc.stdout}"
