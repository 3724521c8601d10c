"""`raygate status` and `kubectl raygate status` against the real API server: RayJobs and RayClusters
labelled and annotated the way the reconciler leaves held and failed jobs."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from raygate.core import booking, keys, pki
from raygate.devenv.controlplane import ControlPlane

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
BIN = Path(sys.executable).parent


def ray_object(sample: str, name: str, state: str | None, annotations: dict[str, str] | None = None) -> Any:
    obj = yaml.safe_load((SAMPLES / sample).read_text())
    obj["metadata"] = {"name": name, "labels": {keys.STATE_LABEL: state} if state else {},
                       "annotations": annotations or {}}
    obj["spec"]["suspend"] = True  # nothing for the KubeRay operator to start
    return obj


@pytest.fixture(scope="module")
def held(cluster: ControlPlane) -> Iterator[dict[str, str]]:
    """Two namespaces: `a` with one object in each state, `b` with a single held RayJob."""
    from uuid import uuid4

    a, b = f"status-a-{uuid4().hex[:5]}", f"status-b-{uuid4().hex[:5]}"
    objs_a = [
        ray_object("rayjob.sample.yaml", "waiting-job", "Pending", {
            keys.ATTEMPT_ANNOTATION: "1", keys.REASON_ANNOTATION: "waiting for capacity: 8 nvidia.com/gpu"}),
        ray_object("rayjob.sample.yaml", "booking-job", "Provisioning", {
            keys.ATTEMPT_ANNOTATION: "2", keys.REQUEST_ANNOTATION: "booking-job-2",
            keys.REASON_ANNOTATION: "ProvisioningRequest booking-job-2 Accepted, not yet Provisioned"}),
        ray_object("rayjob.sample.yaml", "broken-job", "Failed", {
            keys.ATTEMPT_ANNOTATION: "5", keys.REASON_ANNOTATION: "capacity not provisioned after 5 attempts"}),
        ray_object("rayjob.sample.yaml", "running-job", "Admitted", {keys.ATTEMPT_ANNOTATION: "1"}),
        ray_object("rayjob.sample.yaml", "plain-job", None),
        ray_object("raycluster.sample.yaml", "held-cluster", "Pending", {
            keys.REASON_ANNOTATION: "PodGroup held-cluster Inqueue"}),
    ]
    objs_b = [ray_object("rayjob.sample.yaml", "other-job", "Pending")]
    for ns, objs in ((a, objs_a), (b, objs_b)):
        cluster.kubectl("create", "namespace", ns)
        for obj in objs:
            cluster.kubectl("create", "-n", ns, "-f", "-", input_text=json.dumps(obj))
    yield {"a": a, "b": b}
    for ns in (a, b):
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def raygate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "raygate"), *args], capture_output=True, text=True, check=False, timeout=60,
                          env=env if env is not None else dict(os.environ))


def table(stdout: str) -> list[list[str]]:
    """Rows split on the column gaps (the reason may contain single spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines()]


def test_table_lists_held_and_failed_in_one_namespace(cluster: ControlPlane, held: dict[str, str]) -> None:
    proc = raygate("status", "-n", held["a"], "--kubeconfig", str(cluster.kubeconfig))
    assert proc.returncode == 0, proc.stderr
    rows = table(proc.stdout)
    header = rows[0]
    assert header == ["NAMESPACE", "NAME", "STATE", "QUEUE", "POSITION", "AHEAD", "ATTEMPT", "WAITING", "GANG",
                      "REASON"]
    by_name = {r[1]: dict(zip(header, r, strict=True)) for r in rows[1:]}
    assert set(by_name) == {"rayjob/waiting-job", "rayjob/booking-job", "rayjob/broken-job",
                            "raycluster/held-cluster"}
    waiting = by_name["rayjob/waiting-job"]
    assert (waiting["STATE"], waiting["ATTEMPT"]) == ("Pending", "1")
    assert (waiting["GANG"], waiting["REASON"]) == ("-", "waiting for capacity: 8 nvidia.com/gpu")  # no PodGroup
    assert (by_name["rayjob/booking-job"]["STATE"], by_name["rayjob/booking-job"]["ATTEMPT"]) == ("Provisioning", "2")
    assert (by_name["rayjob/broken-job"]["STATE"], by_name["rayjob/broken-job"]["ATTEMPT"]) == ("Failed", "5")
    assert (by_name["raycluster/held-cluster"]["STATE"], by_name["raycluster/held-cluster"]["ATTEMPT"]) == \
        ("Pending", "-")
    assert by_name["raycluster/held-cluster"]["REASON"] == "PodGroup held-cluster Inqueue"
    # The held ones wait in the queue every namespace maps to by default, each with its place; a Failed one in none.
    for name in ("rayjob/waiting-job", "rayjob/booking-job", "raycluster/held-cluster"):
        assert by_name[name]["QUEUE"] == "default" and re.fullmatch(r"\d+/\d+", by_name[name]["POSITION"])
    assert (by_name["rayjob/broken-job"]["QUEUE"], by_name["rayjob/broken-job"]["POSITION"]) == ("-", "-")
    for row in by_name.values():
        assert row["NAMESPACE"] == held["a"]
        assert re.fullmatch(r"\d+s|\d+m(\d+s)?", row["WAITING"]), row


def test_json_output(cluster: ControlPlane, held: dict[str, str]) -> None:
    proc = raygate("status", "-n", held["a"], "-o", "json", "--kubeconfig", str(cluster.kubeconfig))
    assert proc.returncode == 0, proc.stderr
    items = {i["name"]: i for i in json.loads(proc.stdout)["items"]}
    assert set(items) == {"waiting-job", "booking-job", "broken-job", "held-cluster"}
    booking = items["booking-job"]
    assert booking["kind"] == "RayJob" and booking["namespace"] == held["a"]
    assert booking["state"] == "Provisioning" and booking["attempt"] == 2
    assert booking["provisioningRequest"] == "booking-job-2"
    assert booking["reason"] == "ProvisioningRequest booking-job-2 Accepted, not yet Provisioned"
    created = dt.datetime.fromisoformat(booking["creationTimestamp"].replace("Z", "+00:00"))
    expected_wait = (dt.datetime.now(dt.UTC) - created).total_seconds()
    assert abs(booking["waitingSeconds"] - expected_wait) <= 5
    assert items["held-cluster"]["kind"] == "RayCluster" and items["held-cluster"]["attempt"] is None


def test_all_namespaces_and_empty_namespace(cluster: ControlPlane, held: dict[str, str],
                                            make_namespace: Callable[..., str]) -> None:
    proc = raygate("status", "-A", "-o", "json", "--kubeconfig", str(cluster.kubeconfig))
    assert proc.returncode == 0, proc.stderr
    mine = {(i["namespace"], i["name"]) for i in json.loads(proc.stdout)["items"]
            if i["namespace"] in held.values()}
    assert (held["b"], "other-job") in mine and (held["a"], "broken-job") in mine and len(mine) == 5
    empty = make_namespace("status-empty")
    proc = raygate("status", "-n", empty, "--kubeconfig", str(cluster.kubeconfig))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"No held or failed RayJobs or RayClusters in namespace {empty}."


def test_kubectl_plugin(cluster: ControlPlane, held: dict[str, str]) -> None:
    """`kubectl raygate status`: kubectl finds kubectl-raygate on PATH and passes KUBECONFIG through."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "PATH": os.pathsep.join([str(BIN), str(cluster.bundle.bin_dir), "/usr/bin", "/bin"])}
    plugins = subprocess.run(["kubectl", "plugin", "list"], capture_output=True, text=True, env=env, check=False)
    assert str(BIN / "kubectl-raygate") in plugins.stdout, plugins.stdout + plugins.stderr
    proc = subprocess.run(["kubectl", "raygate", "status", "-n", held["b"]], capture_output=True, text=True,
                          env=env, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = table(proc.stdout)
    assert [r[:3] for r in rows[1:]] == [[held["b"], "rayjob/other-job", "Pending"]]


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("raygate: error: ")
    return lines[0]


def _kubeconfig(path: Path, server: str, ca: str, cert: str, key: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "u", "user": {"client-certificate": cert, "client-key": key}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


def test_unreachable_cluster_is_one_line(cluster: ControlPlane, tmp_path: Path) -> None:
    from raygate.devenv.controlplane import free_port

    p = cluster.pki
    cfg = _kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{free_port()}", str(p / "ca.crt"),
                      str(p / "admin.crt"), str(p / "admin.key"))
    line = _one_line(raygate("status", "-A", "--kubeconfig", str(cfg)))
    assert "cannot reach the API server" in line


def test_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    line = _one_line(raygate("status", "--kubeconfig", str(tmp_path / "nope")))
    assert "kubeconfig" in line.lower() or "credentials" in line


def _user_kubeconfig(cluster: ControlPlane, tmp_path: Path, user: str) -> Path:
    ca = pki.KeyPair((cluster.pki / "ca.crt").read_bytes(), (cluster.pki / "ca.key").read_bytes())
    leaf = pki.make_leaf(ca, user, dt.timedelta(hours=1), server=False, client=True)
    (tmp_path / "u.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "u.key").write_bytes(leaf.key_pem)
    return _kubeconfig(tmp_path / "kc", cluster.server, str(cluster.pki / "ca.crt"), str(tmp_path / "u.crt"),
                       str(tmp_path / "u.key"))


def test_forbidden_is_one_line(cluster: ControlPlane, tmp_path: Path) -> None:
    cfg = _user_kubeconfig(cluster, tmp_path, "raygate-test-nobody")
    line = _one_line(raygate("status", "-n", "default", "--kubeconfig", str(cfg)))
    assert "forbidden" in line and "rayjobs.ray.io" in line and "raygate-test-nobody" in line, line


def test_explain_against_a_cluster_without_gang_scheduling_refuses_native_mode_naming_the_flags(
        cluster: ControlPlane) -> None:
    line = _one_line(raygate("explain", "-f", str(SAMPLES / "rayjob.sample.yaml"), "--mode", "native",
                             "--kubeconfig", str(cluster.kubeconfig)))
    assert "native mode needs Kubernetes' gang scheduling" in line
    assert all(flag in line for flag in (*keys.GANG_APISERVER_FLAGS, *keys.GANG_SCHEDULER_FLAGS)), line


def test_a_job_whose_request_is_provisioned_is_counted_ahead_of_no_one(
        cluster: ControlPlane, make_namespace: Callable[..., str]) -> None:
    """Its capacity is booked and it is about to be admitted: the job behind it is the front, as the reconciler
    counts it (so that job asks as the front, and says so)."""
    ns = make_namespace("status-booked")
    classes = {"status-first": 999_999_001, "status-second": 999_999_000}  # ahead of any other test's jobs
    for name, value in classes.items():
        cluster.kubectl("create", "-f", "-", input_text=json.dumps(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
             "value": value}))
    try:
        for name, state, annotations in (("first", "Provisioning", {keys.ATTEMPT_ANNOTATION: "1",
                                                                    keys.REQUEST_ANNOTATION: "first-1"}),
                                         ("second", "Pending", {})):
            obj = ray_object("rayjob.sample.yaml", name, state, annotations)
            obj["metadata"]["labels"][keys.RAY_PRIORITY_CLASS_LABEL] = f"status-{name}"
            cluster.kubectl("create", "-n", ns, "-f", "-", input_text=json.dumps(obj))

        def places() -> dict[str, Any]:
            proc = raygate("status", "-n", ns, "-o", "json", "--kubeconfig", str(cluster.kubeconfig))
            assert proc.returncode == 0, proc.stderr
            return {i["name"]: i["queue"] for i in json.loads(proc.stdout)["items"]}

        before = places()
        assert (before["first"]["position"], before["second"]["position"]) == (1, 2), before
        assert before["second"]["ahead"] == f"RayJob {ns}/first"
        uid = cluster.kubectl("get", "rayjob", "first", "-n", ns, "-o", "jsonpath={.metadata.uid}")
        owner = {"apiVersion": f"{keys.RAY_GROUP}/{keys.RAY_VERSION}", "kind": keys.RAYJOB_KIND, "name": "first",
                 "uid": uid, "controller": True}  # as the reconciler makes it: one not made for the job books nothing
        request = {"apiVersion": f"{keys.PROVREQ_GROUP}/v1", "kind": "ProvisioningRequest",
                   "metadata": {"name": "first-1", "labels": {keys.MANAGED_BY_LABEL: keys.MANAGED_BY_VALUE},
                                "ownerReferences": [owner]},
                   "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                            "podSets": [{"podTemplateRef": {"name": "first"}, "count": 1}]}}
        cluster.kubectl("create", "-n", ns, "-f", "-", input_text=json.dumps(request))
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        booked = {"status": {"conditions": [
            {"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": now}
            for t in (booking.ACCEPTED, booking.PROVISIONED)]}}
        cluster.kubectl("patch", "-n", ns, f"provisioningrequests.{keys.PROVREQ_GROUP}", "first-1",
                        "--subresource=status", "--type=merge", "-p", json.dumps(booked))
        after = places()
        assert after["second"]["position"] == 1 and after["second"]["ahead"] is None, after
        assert after["second"]["length"] == before["second"]["length"] - 1
        assert after["first"]["name"] == before["first"]["name"] and after["first"]["position"] is None, after
    finally:
        cluster.kubectl("delete", "priorityclass", *classes, check=False)


def test_a_user_with_rights_in_one_namespace_sees_its_jobs_places(cluster: ControlPlane, held: dict[str, str],
                                                                  tmp_path: Path) -> None:
    """The users clusters have: Kubernetes' built-in `edit` role and a Role on Ray objects, in one namespace. They may
    list neither other namespaces, PriorityClasses, raygate's config nor its ProvisioningRequests: the places are
    computed among what they may list, not refused."""
    ns = held["a"]
    rbac = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "ray-edit"},
             "rules": [{"apiGroups": [keys.RAY_GROUP], "resources": [keys.RAYJOB_PLURAL, keys.RAYCLUSTER_PLURAL],
                        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]},
            *({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": f"carol-{r}"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": r},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}]}
              for kind, r in (("Role", "ray-edit"), ("ClusterRole", "edit")))]
    for obj in rbac:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input_text=json.dumps(obj))
    proc = raygate("status", "-n", ns, "-o", "json", "--kubeconfig", str(_user_kubeconfig(cluster, tmp_path, "carol")))
    assert proc.returncode == 0, proc.stderr
    places = {i["name"]: i["queue"] for i in json.loads(proc.stdout)["items"]}
    assert places["broken-job"] is None  # Failed: in no queue
    held_here = sorted(p["position"] for name, p in places.items() if p is not None)
    assert held_here == [1, 2, 3] and {p["length"] for p in places.values() if p is not None} == {3}, places
