"""The built image (`make image`, part of `make test`): raygate's commands run inside it as the
image's non-root user on a read-only root filesystem, its size stays inside a budget, and its
webhook serves the local API server and holds a job.

Containers run with podman and runc, no network, every capability dropped. Two settings are
forced by this sandbox and harmless elsewhere (docs/development.md, "The image", quotes the errors):
- runc, not podman's default crun: crun 1.8 refuses the hybrid cgroup v1 + v2 layout here
  ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2");
- explicit low ulimits: podman's defaults (nofile 1048576, nproc 4194304) exceed the hard
  limits and the process lacks CAP_SYS_RESOURCE ("setrlimit `RLIMIT_NOFILE`: Operation not
  permitted").
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from builders import gpu_job
from waiting import wait

import raygate
from raygate.core import keys
from raygate.devenv.controlplane import ControlPlane, free_port
from raygate.devenv.raygate_local import (
    CERTS_RBAC,
    RECONCILER_RBAC,
    RECONCILER_USER,
    LocalWebhook,
    ensure_system_namespace,
    unregister_webhook,
    write_tls,
)
from raygate.devenv.registration import configurations

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
CONTAINER = [
    "--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
    # As a Deployment runs it: read-only root with no tmpfs added (podman adds /tmp by default;
    # the Deployments mount their own), no capabilities, no privilege escalation.
    "--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
]
RUN = ["run", "--rm", "--network", "none", *CONTAINER, "--env", f"COLUMNS={COLUMNS}"]


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


# raygate as the wheel installs it: without the workshop (raygate/devenv, which this checkout has).
AS_INSTALLED = ("import sys; sys.modules['raygate.devenv'] = None; from raygate.cli import main; "
                "sys.exit(main())")


def local_help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": COLUMNS}
    proc = subprocess.run([sys.executable, "-c", AS_INSTALLED, *args], capture_output=True, text=True,
                          env=env, check=True)
    return proc.stdout


@pytest.mark.parametrize("args", [["--help"], ["webhook", "--help"], ["reconciler", "--help"]],
                         ids=["raygate", "webhook", "reconciler"])
def test_command_runs_in_the_image_read_only_as_non_root(args: list[str]) -> None:
    proc = run_in_image(*args)
    assert proc.returncode == 0, f"`raygate {' '.join(args)}` in {IMAGE} failed:\n{proc.stderr}"
    # The same help as this checkout's: the image holds this code, not a stale build.
    assert proc.stdout == local_help(*args), f"{IMAGE} was built from other code than this checkout: run `make image`"


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


def _embedded_kubeconfig(cluster: ControlPlane) -> str:
    """The admin kubeconfig with its certificates inline: the container user cannot read the
    control plane's key files (mode 0600, root), and their host paths do not exist inside."""
    cfg = json.loads(cluster.kubeconfig.read_text())
    for entry, fields in (("clusters", ("certificate-authority",)), ("users", ("client-certificate", "client-key"))):
        for item in cfg[entry]:
            inner = item["cluster" if entry == "clusters" else "user"]
            for f in fields:
                inner[f"{f}-data"] = base64.b64encode(Path(inner.pop(f)).read_bytes()).decode()
    return json.dumps(cfg)


@pytest.mark.integration
def test_webhook_and_reconciler_in_the_image_hold_a_job_and_request_its_capacity(
    cluster: ControlPlane, make_namespace: Callable[..., str], tmp_path: Path
) -> None:
    """Both Deployments' commands from the image against the local API server (host network, the
    Deployments' /tmp as a tmpfs, read-only files mounted like their Secret): the webhook holds a GPU
    RayJob created through it, and the reconciler, acting as its service account with the install's
    RBAC, creates the job's ProvisioningRequest."""
    inspected()
    files = tmp_path / "mounted"
    ca, _, _ = write_tls(files)
    (files / "kubeconfig").write_text(_embedded_kubeconfig(cluster))
    files.chmod(0o755)
    for f in files.iterdir():
        f.chmod(0o644)  # test credentials in a test's own directory; the Deployment uses fsGroup instead
    ensure_system_namespace(cluster)
    cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
    cluster.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                    f"--from-literal={keys.CONFIGMAP_KEY}=defaults: {{mode: provisioning}}\n")
    for rbac in (RECONCILER_RBAC, CERTS_RBAC):
        cluster.kubectl("apply", "-f", str(rbac))
    port, suffix = free_port(), uuid.uuid4().hex[:6]
    names = {"webhook": f"raygate-image-webhook-{suffix}", "reconciler": f"raygate-image-reconciler-{suffix}"}
    common = ["--network", "host", *CONTAINER, "--tmpfs", "/tmp:rw,size=64m,mode=1777",
              "--volume", f"{files}:/etc/raygate:ro", IMAGE]
    args = {
        "webhook": ["webhook", "--bind", "127.0.0.1", "--port", str(port), "--workers", "1",
                    "--tls-cert-file", "/etc/raygate/tls.crt", "--tls-key-file", "/etc/raygate/tls.key",
                    "--worker-tmp-dir", "/tmp"],
        "reconciler": ["reconciler", "--metrics-port", "0", "--no-leader-elect", "--no-manage-certs",
                       "--as", RECONCILER_USER],
    }

    def running(component: str) -> None:
        state = podman("inspect", "--format", "{{.State.Running}}", names[component]).stdout.strip()
        assert state == "true", f"the {component} container stopped: {podman('logs', names[component]).stderr[-3000:]}"

    try:
        for component, name in names.items():
            started = podman("run", "--detach", "--name", name, *common, *args[component],
                             "--kubeconfig", "/etc/raygate/kubeconfig", "--namespace", keys.SYSTEM_NAMESPACE)
            assert started.returncode == 0, started.stderr
        hook = LocalWebhook(f"https://127.0.0.1:{port}", ca)

        def ready() -> bool:
            running("webhook")
            return hook.readyz()[0] == 200

        wait(ready, 60, f"/readyz of the webhook in {IMAGE}")
        for obj in configurations(hook.url, ca.read_bytes(), "Fail"):
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(obj))
        ns = make_namespace("image", labels={keys.OPT_IN_LABEL: keys.OPT_IN_VALUE})
        job = gpu_job("train", ns).obj()
        created = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input_text=json.dumps(job)))
        assert created["spec"]["suspend"] is True
        assert created["metadata"]["labels"][keys.STATE_LABEL] == keys.State.PENDING

        def requested() -> dict[str, object] | None:
            running("reconciler")
            got = json.loads(cluster.kubectl("get", "rayjob", "train", "-n", ns, "-o", "json"))
            return got if got["metadata"]["labels"].get(keys.STATE_LABEL) == keys.State.PROVISIONING else None

        held = wait(requested, 60, "the reconciler in the image to request the job's capacity")
        request = held["metadata"]["annotations"][keys.REQUEST_ANNOTATION]
        cluster.kubectl("get", "provisioningrequest", request, "-n", ns)  # fails if it does not exist
        assert held["spec"]["suspend"] is True
    finally:
        unregister_webhook(cluster)
        for name in names.values():
            podman("rm", "--force", "--time", "5", name)
        cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
