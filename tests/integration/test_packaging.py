"""The wheel the image is built from: built from exactly the files the Dockerfile copies, installed into
a fresh virtualenv with its dependencies, and run through the commands the Deployments run: it installs
one top-level name, and both servers start from it against the local API server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from builders import gpu_job, review
from waiting import wait

from raygate.devenv.controlplane import ControlPlane, free_port
from raygate.devenv.raygate_local import LocalWebhook, write_tls

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


def _env() -> dict[str, str]:
    """Nothing from this checkout: the installed wheel is all the interpreter can import raygate from."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(argv: list[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=_env(), capture_output=True, text=True, check=False, timeout=timeout
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
    # The workshop (the local stack, the demo) stays in the checkout.
    assert not [n for n in names if n.startswith("raygate/devenv/")], "raygate/devenv is not part of the product"
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
        ([], ["webhook", "reconciler", "certs", "explain", "status", "release"]),
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
    if not command:  # the workshop's commands are a checkout's: the wheel has none of them
        assert not [c for c in ("dev", "demo") if f"\n    {c} " in proc.stdout], proc.stdout


def test_the_installed_distribution_has_one_top_level_name(venv_bin: Path, tmp_path: Path) -> None:
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps(sorted({f.parts[0] for f in m.files('raygate') if f.parts[0] != '..' "
            "and not f.parts[0].endswith('.dist-info')})))")
    proc = _run([venv_bin / "python", "-c", code], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["raygate"]
    for folder in ("webhook", "reconciler", "certs"):  # names other distributions may own
        proc = _run([venv_bin / "python", "-c", f"import {folder}"], cwd=tmp_path)
        assert "ModuleNotFoundError" in proc.stderr, f"`import {folder}` works in a venv holding only raygate"


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a server from the wheel's console script; SIGTERM (then SIGKILL) at the end of the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def run(name: str, *argv: str | Path) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen([str(a) for a in argv], cwd=tmp_path, env=_env(), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _up(proc: subprocess.Popen[bytes], log: Path, probe: Callable[[], bool]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"exited with {proc.returncode}: {log.read_text()[-3000:]}")
    return probe()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


@pytest.mark.integration
def test_both_servers_start_from_the_wheel(venv_bin: Path, cluster: ControlPlane, tmp_path: Path,
                                           start: Callable[..., subprocess.Popen[bytes]]) -> None:
    namespace = f"pkg-{uuid.uuid4().hex[:6]}"  # its own Lease and (absent) ConfigMap: the defaults
    cluster.kubectl("create", "namespace", namespace)
    try:
        ca, cert, key = write_tls(tmp_path / "tls")
        port, metrics_port = free_port(), free_port()
        webhook = start("webhook", venv_bin / "raygate", "webhook", "--bind", "127.0.0.1", "--port", str(port),
                        "--tls-cert-file", cert, "--tls-key-file", key, "--kubeconfig", cluster.kubeconfig,
                        "--namespace", namespace, "--workers", "1", "--threads", "2", "--worker-tmp-dir", tmp_path)
        reconciler = start("reconciler", venv_bin / "raygate", "reconciler", "--kubeconfig", cluster.kubeconfig,
                           "--namespace", namespace, "--metrics-port", str(metrics_port), "--workers", "1",
                           "--no-manage-certs")
        hook = LocalWebhook(f"https://127.0.0.1:{port}", ca)
        wait(lambda: _up(webhook, tmp_path / "webhook.log", lambda: hook.readyz()[0] == 200), 60,
             "the installed webhook to be ready")
        wait(lambda: _up(reconciler, tmp_path / "reconciler.log",
                         lambda: _get(f"http://127.0.0.1:{metrics_port}/readyz") == 200), 60,
             "the installed reconciler to be ready")

        # The webhook answers a review with the decision code the wheel installed (modes included).
        body = review(gpu_job("train", namespace).obj(), namespace=namespace)
        req = urllib.request.Request(f"{hook.url}/mutate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(ca)), timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["response"]["uid"] == body["request"]["uid"] and answer["response"]["allowed"] is True
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
