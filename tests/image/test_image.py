"""The built image (`make image`, part of `make test`): raygate's commands run inside it as the
image's non-root user on a read-only root filesystem, and its size stays inside a budget.

Containers run with podman and runc, no network, every capability dropped. Two settings are
forced by this sandbox and harmless elsewhere (the README's troubleshooting quotes the errors):
- runc, not podman's default crun: crun 1.8 refuses the hybrid cgroup v1 + v2 layout here
  ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2");
- explicit low ulimits: podman's defaults (nofile 1048576, nproc 4194304) exceed the hard
  limits and the process lacks CAP_SYS_RESOURCE ("setrlimit `RLIMIT_NOFILE`: Operation not
  permitted").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import raygate

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("RAYGATE_IMAGE", f"localhost/raygate:{raygate.__version__}")
# The Deployments' runAsUser (tests/unit/test_dockerfile.py ties the Dockerfile's USER to it).
IMAGE_USER = "65532:65532"
# Measured 314 MB on bookworm's python3.11 (126 MB base); the kubernetes client alone is 126 MB.
# A budget, not a target: it catches a dependency or a build stage leaking into the final image.
SIZE_BUDGET_MB = 340
# argparse wraps help text to $COLUMNS: the same width inside and outside the container.
COLUMNS = "100"
RUN = [
    "run", "--rm", "--runtime", "runc", "--network", "none",
    "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
    # As a Deployment runs it: read-only root with no tmpfs added (podman adds /tmp by default;
    # the Deployments mount their own), no capabilities, no privilege escalation.
    "--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--env", f"COLUMNS={COLUMNS}",
]


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=300, check=False)


@cache
def inspected() -> dict[str, object]:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: `make image` installs the image tools (Debian packages)")
    proc = podman("image", "inspect", IMAGE)
    if proc.returncode != 0:
        pytest.fail(f"image {IMAGE} is not built: run `make image` (part of `make test`): {proc.stderr.strip()}")
    found: list[dict[str, object]] = json.loads(proc.stdout)
    return found[0]


def run_in_image(*args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    inspected()
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return podman(*RUN, *extra, IMAGE, *args)


def local_help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": COLUMNS}
    proc = subprocess.run([sys.executable, "-m", "raygate", *args], capture_output=True, text=True,
                          env=env, check=True)
    return proc.stdout


@pytest.mark.parametrize("args", [["--help"], ["webhook", "--help"], ["reconciler", "--help"]],
                         ids=["raygate", "webhook", "reconciler"])
def test_command_runs_in_the_image_read_only_as_non_root(args: list[str]) -> None:
    proc = run_in_image(*args)
    assert proc.returncode == 0, f"`raygate {' '.join(args)}` in {IMAGE} failed:\n{proc.stderr}"
    # The same help as this checkout's: the image holds this code, not a stale build.
    assert proc.stdout == local_help(*args)


def test_image_runs_as_the_non_root_user_of_the_manifests() -> None:
    config = inspected()["Config"]
    assert isinstance(config, dict)
    assert config["User"] == IMAGE_USER
    assert config["Entrypoint"] == ["raygate"]
    proc = run_in_image("-c", "import os; print(f'{os.getuid()}:{os.getgid()}')", entrypoint="python3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == IMAGE_USER


def test_root_filesystem_is_read_only_in_the_test_runs() -> None:
    """Proves the runs above had no writable root: every write fails with EROFS (read-only file
    system), also in /tmp, which is world-writable in the image and so writable without --read-only."""
    script = (
        "import errno, tempfile\n"
        "for d in ('/', '/tmp', '/usr/local/lib'):\n"
        "    try:\n"
        "        tempfile.NamedTemporaryFile(dir=d)\n"
        "        print('wrote', d)\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno], d)\n"
    )
    proc = run_in_image("-c", script, entrypoint="python3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["EROFS /", "EROFS /tmp", "EROFS /usr/local/lib"], proc.stdout


def test_image_size_is_within_budget(record_property: pytest.RecordProperty) -> None:
    size = inspected()["Size"]
    assert isinstance(size, int)
    mb = size / 1e6
    record_property("image_size_mb", round(mb, 1))
    print(f"\n{IMAGE}: {mb:.0f} MB (budget {SIZE_BUDGET_MB} MB)")
    assert mb <= SIZE_BUDGET_MB, f"{IMAGE} is {mb:.0f} MB, over the {SIZE_BUDGET_MB} MB budget"
