"""The install manifests (config/): rendered by kustomize, checked against raygate/core/keys.py and the CLI,
dry-run applied to a real kube-apiserver, and the RBAC proven with `kubectl auth can-i`."""

from __future__ import annotations

import json
import posixpath
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from raygate.core import keys, podgate_policy
from raygate.devenv.build import Bundle
from raygate.devenv.controlplane import ControlPlane

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "config"
IMAGE = "ghcr.io/raygate/raygate:0.1.0"
UID = 65532
Obj = dict[str, Any]

RBAC_KINDS = ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                  "ValidatingWebhookConfiguration")
CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"


# --- rendering -------------------------------------------------------------------------------------
def render(bundle: Bundle, overlay: str) -> list[Obj]:
    proc = subprocess.run(
        [str(bundle.binary("kubectl")), "kustomize", str(CONFIG / overlay)],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, f"kustomize {overlay} failed: {proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def dump(objs: list[Obj]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False)


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def of_kind(objs: list[Obj], *kinds: str) -> list[Obj]:
    return [o for o in objs if o["kind"] in kinds]


def containers(deploy: Obj) -> list[Obj]:
    spec = deploy["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions, ANDed)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def ns_labels(name: str, opted_in: bool) -> dict[str, str]:
    labels = {"kubernetes.io/metadata.name": name}  # set by the API server on every namespace
    if opted_in:
        labels[keys.OPT_IN_LABEL] = keys.OPT_IN_VALUE
    return labels


@pytest.fixture(scope="module")
def default_objs(bundle: Bundle) -> list[Obj]:
    return render(bundle, "default")


@pytest.fixture(scope="module")
def cm_objs(bundle: Bundle) -> list[Obj]:
    return render(bundle, "cert-manager")


# --- render checks: names --------------------------------------------------------------------------
def test_names_are_the_ones_keys_defines(default_objs: list[Obj]) -> None:
    find(default_objs, "Namespace", keys.SYSTEM_NAMESPACE)
    find(default_objs, "ServiceAccount", keys.WEBHOOK_SERVICE_ACCOUNT)
    find(default_objs, "ServiceAccount", keys.RECONCILER_SERVICE_ACCOUNT)
    find(default_objs, "MutatingWebhookConfiguration", keys.MUTATING_WEBHOOK_CONFIG)
    find(default_objs, "ValidatingWebhookConfiguration", keys.VALIDATING_WEBHOOK_CONFIG)
    cm = find(default_objs, "ConfigMap", keys.CONFIGMAP_NAME)
    config = yaml.safe_load(cm["data"][keys.CONFIGMAP_KEY])
    assert isinstance(config, dict) and "defaults" in config, config
    svc = find(default_objs, "Service", keys.WEBHOOK_SERVICE)
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(443, keys.WEBHOOK_PORT)]
    for obj in default_objs:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace") == keys.SYSTEM_NAMESPACE, obj["metadata"]


def test_every_container_runs_the_pinned_image(default_objs: list[Obj], cm_objs: list[Obj]) -> None:
    for objs in (default_objs, cm_objs):
        for deploy in of_kind(objs, "Deployment"):
            assert {c["image"] for c in containers(deploy)} == {IMAGE}, deploy["metadata"]["name"]


# --- render checks: webhook configurations ---------------------------------------------------------
WEBHOOK_CASES = [
    ("MutatingWebhookConfiguration", keys.MUTATING_WEBHOOK_CONFIG, "/mutate", ["CREATE", "UPDATE"]),
    ("ValidatingWebhookConfiguration", keys.VALIDATING_WEBHOOK_CONFIG, "/validate", ["CREATE", "UPDATE"]),
]


@pytest.mark.parametrize(("kind", "name", "path", "operations"), WEBHOOK_CASES, ids=["mutating", "validating"])
def test_webhook_configuration(
    default_objs: list[Obj], kind: str, name: str, path: str, operations: list[str]
) -> None:
    config = find(default_objs, kind, name)
    assert len(config["webhooks"]) == 1
    hook = config["webhooks"][0]
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] <= 5
    assert hook["failurePolicy"] == "Fail"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["admissionReviewVersions"] == ["v1"]
    if kind == "MutatingWebhookConfiguration":
        assert hook["reinvocationPolicy"] == "Never"
    assert hook["rules"] == [{
        "apiGroups": [keys.RAY_GROUP],
        "apiVersions": [keys.RAY_VERSION],
        "resources": [keys.RAYJOB_PLURAL, keys.RAYCLUSTER_PLURAL],
        "operations": operations,
        "scope": "Namespaced",
    }, {  # the pod gate: pods are gated at creation, and guarded on update
        "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
        "operations": ["CREATE"] if kind == "MutatingWebhookConfiguration" else ["CREATE", "UPDATE"],
        "scope": "Namespaced",
    }, {  # KubeRay's batch Jobs: the Ray object their pods serve, stamped at creation and guarded on update
        "apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"],
        "operations": ["CREATE"] if kind == "MutatingWebhookConfiguration" else ["CREATE", "UPDATE"],
        "scope": "Namespaced",
    }]
    assert hook["clientConfig"]["service"] == {
        "name": keys.WEBHOOK_SERVICE, "namespace": keys.SYSTEM_NAMESPACE, "path": path, "port": 443,
    }
    # Left to `raygate certs ensure`: a caBundle in the manifest would be reset by every re-apply.
    assert "caBundle" not in hook["clientConfig"]


@pytest.mark.parametrize(("kind", "name"), [c[:2] for c in WEBHOOK_CASES], ids=["mutating", "validating"])
@pytest.mark.parametrize(
    ("namespace", "opted_in", "expected"),
    [
        ("ml-team", True, True),
        ("ml-team", False, False),
        ("kube-system", True, False),
        (keys.SYSTEM_NAMESPACE, True, False),
        ("default", False, False),
    ],
)
def test_webhook_namespace_selector(
    default_objs: list[Obj], kind: str, name: str, namespace: str, opted_in: bool, expected: bool
) -> None:
    hook = find(default_objs, kind, name)["webhooks"][0]
    assert "objectSelector" not in hook or hook["objectSelector"] == {}
    assert selects(hook["namespaceSelector"], ns_labels(namespace, opted_in)) is expected


# --- render checks: workloads ----------------------------------------------------------------------
@pytest.mark.parametrize("overlay", ["default", "cert-manager", "one-process"])
def test_pods_are_hardened(bundle: Bundle, overlay: str) -> None:
    deploys = of_kind(render(bundle, overlay), "Deployment")
    assert {d["metadata"]["name"] for d in deploys} == (
        {"raygate-webhook"} if overlay == "one-process" else {"raygate-webhook", "raygate-reconciler"})
    for deploy in deploys:
        pod = deploy["spec"]["template"]["spec"]
        pod_sc = pod.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True
        tmp_volumes = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for c in containers(deploy):
            where = f"{deploy['metadata']['name']}/{c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert "add" not in sc.get("capabilities", {}), where
            assert sc.get("privileged", False) is False, where
            assert sc.get("runAsUser", pod_sc.get("runAsUser")) == UID, where
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            assert seccomp.get("type") == "RuntimeDefault", where
            for bound in ("requests", "limits"):
                assert set(c.get("resources", {}).get(bound, {})) >= {"cpu", "memory"}, f"{where} {bound}"
            if c["name"] in ("webhook", "reconciler"):
                tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
                assert len(tmp) == 1 and tmp[0]["name"] in tmp_volumes, f"{where}: /tmp must be an emptyDir"


def _port(container: Obj, ref: int | str) -> int:
    if isinstance(ref, int):
        return ref
    return next(int(p["containerPort"]) for p in container["ports"] if p["name"] == ref)


def _flag(args: list[str], flag: str) -> str:
    """The value of `--flag value` or `--flag=value` in a container's args."""
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {args}")


def test_webhook_deployment(default_objs: list[Obj]) -> None:
    deploy = find(default_objs, "Deployment", "raygate-webhook")
    spec = deploy["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2
    assert selects(spec["selector"], labels)
    assert pod["serviceAccountName"] == keys.WEBHOOK_SERVICE_ACCOUNT
    spread = pod.get("topologySpreadConstraints", [])
    anti = pod.get("affinity", {}).get("podAntiAffinity")
    assert anti or any(
        t["topologyKey"] == "kubernetes.io/hostname" and selects(t["labelSelector"], labels) for t in spread
    ), "the two replicas must be spread over nodes"

    (init,) = pod["initContainers"]
    assert init["args"] == ["certs", "ensure"]
    (server,) = pod["containers"]
    args = server["args"]
    assert args[0] == "webhook"
    assert int(_flag(args, "--port")) == keys.WEBHOOK_PORT
    assert {p["containerPort"] for p in server["ports"]} == {keys.WEBHOOK_PORT}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = server[probe]["httpGet"]
        assert (get["path"], get["scheme"], _port(server, get["port"])) == (path, "HTTPS", keys.WEBHOOK_PORT)
    env = {e["name"]: e for e in server["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"

    # The certificate files the server is told to load come from the TLS Secret, mounted read-only;
    # gunicorn's worker heartbeat directory is a writable emptyDir.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert "emptyDir" in volumes[mounts[_flag(args, "--worker-tmp-dir")]["name"]]
    for flag in ("--tls-cert-file", "--tls-key-file"):
        mount = mounts[posixpath.dirname(_flag(args, flag))]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["secret"]["secretName"] == keys.TLS_SECRET

    # The Service routes to these pods and this port, and a PodDisruptionBudget keeps one up.
    svc = find(default_objs, "Service", keys.WEBHOOK_SERVICE)
    assert selects({"matchLabels": svc["spec"]["selector"]}, labels)
    pdb = find(default_objs, "PodDisruptionBudget", "raygate-webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert selects(pdb["spec"]["selector"], labels)
    reconciler = find(default_objs, "Deployment", "raygate-reconciler")["spec"]["template"]["metadata"]["labels"]
    assert not selects({"matchLabels": svc["spec"]["selector"]}, reconciler)
    assert not selects(pdb["spec"]["selector"], reconciler)


def test_reconciler_deployment(default_objs: list[Obj]) -> None:
    spec = find(default_objs, "Deployment", "raygate-reconciler")["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert pod["serviceAccountName"] == keys.RECONCILER_SERVICE_ACCOUNT
    assert "initContainers" not in pod
    (c,) = pod["containers"]
    assert c["args"][0] == "reconciler"
    assert "--leader-elect" in c["args"]
    port = int(_flag(c["args"], "--metrics-port"))
    assert port == 8080
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert get.get("scheme", "HTTP") == "HTTP"
        assert _port(c, get["port"]) == port


@pytest.mark.parametrize("overlay", ["default", "cert-manager", "one-process"])
def test_container_args_are_accepted_by_the_cli(bundle: Bundle, overlay: str) -> None:
    """Every command line the manifests run parses with raygate's own argument parser, so a renamed or
    missing flag fails here rather than in a crash-looping pod."""
    from raygate.cli import build_parser

    for deploy in of_kind(render(bundle, overlay), "Deployment"):
        for c in containers(deploy):
            args = [*c.get("command", [])[1:], *c["args"]]
            try:
                build_parser().parse_args(args)
            except SystemExit as exc:
                pytest.fail(f"{overlay}: {deploy['metadata']['name']}/{c['name']} runs `raygate "
                            f"{' '.join(args)}`, which the CLI refuses (exit {exc.code})")


def test_one_process_overlay_serves_and_reconciles_from_the_webhooks_pods_as_one_identity(bundle: Bundle) -> None:
    """config/one-process: the webhook's Deployment runs `raygate serve` as the reconciler's account (whose grants
    the RBAC cases below check), probes and Service as before, the reconciler's metrics port beside; nothing is
    left of the webhook's account or of the reconciler's Deployment."""
    objs = render(bundle, "one-process")
    (deploy,) = of_kind(objs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == keys.RECONCILER_SERVICE_ACCOUNT
    (server,) = pod["containers"]
    args = server["args"]
    assert args[0] == "serve" and int(_flag(args, "--port")) == keys.WEBHOOK_PORT
    assert {p["containerPort"] for p in server["ports"]} == {keys.WEBHOOK_PORT, int(_flag(args, "--metrics-port"))}
    assert server["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert {e["name"] for e in server["env"]} >= {"POD_NAMESPACE", "POD_NAME"}
    assert deploy["spec"]["replicas"] == 2  # every replica serves; one reconciles
    sa_subjects = {s["name"] for b in of_kind(objs, "RoleBinding", "ClusterRoleBinding") for s in b["subjects"]}
    assert sa_subjects == {keys.RECONCILER_SERVICE_ACCOUNT}
    assert {o["metadata"]["name"] for o in of_kind(objs, "ServiceAccount")} == {keys.RECONCILER_SERVICE_ACCOUNT}
    assert not [o for o in objs if o["metadata"]["name"] == keys.WEBHOOK_SERVICE_ACCOUNT
                and o["kind"] not in ("Deployment", "Service", "PodDisruptionBudget")]


def test_no_rbac_rule_uses_wildcards_or_reads_secrets_cluster_wide(default_objs: list[Obj]) -> None:
    for role in of_kind(default_objs, "Role", "ClusterRole"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], role["metadata"]["name"]
            if role["kind"] == "ClusterRole":
                assert "secrets" not in rule["resources"], role["metadata"]["name"]


# --- cert-manager overlay (rendered only: cert-manager's CRDs are not part of the test cluster) ----
def test_cert_manager_overlay(cm_objs: list[Obj]) -> None:
    certs = {c["metadata"]["name"]: c for c in of_kind(cm_objs, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in of_kind(cm_objs, "Issuer")}
    serving = [c for c in certs.values() if c["spec"]["secretName"] == keys.TLS_SECRET]
    assert len(serving) == 1, "one Certificate must write the webhook's TLS Secret"
    cert = serving[0]
    assert f"{keys.WEBHOOK_SERVICE}.{keys.SYSTEM_NAMESPACE}.svc" in cert["spec"]["dnsNames"]

    # The issuer chain ends in a self-signed Issuer that is part of the overlay.
    issuer = issuers[cert["spec"]["issuerRef"]["name"]]
    for _ in range(len(issuers)):
        if "selfSigned" in issuer["spec"]:
            break
        ca_cert = next(c for c in certs.values() if c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"])
        assert ca_cert["spec"]["isCA"] is True
        issuer = issuers[ca_cert["spec"]["issuerRef"]["name"]]
    assert "selfSigned" in issuer["spec"]

    inject = f"{cert['metadata']['namespace']}/{cert['metadata']['name']}"
    for kind, name, *_ in WEBHOOK_CASES:
        assert find(cm_objs, kind, name)["metadata"]["annotations"][CERT_MANAGER_ANNOTATION] == inject

    # raygate's own certificate handling is gone: no init container, the reconciler told not to
    # manage certificates, and no grant to write Secrets or webhook configurations.
    webhook = find(cm_objs, "Deployment", "raygate-webhook")["spec"]["template"]["spec"]
    assert "initContainers" not in webhook
    tls = next(v for v in webhook["volumes"] if v.get("secret", {}).get("secretName") == keys.TLS_SECRET)
    assert tls["secret"].get("optional", False) is False
    reconciler = find(cm_objs, "Deployment", "raygate-reconciler")["spec"]["template"]["spec"]
    assert "--no-manage-certs" in reconciler["containers"][0]["args"]
    for role in of_kind(cm_objs, "Role", "ClusterRole"):
        for rule in role["rules"]:
            written = set(rule["resources"]) & {"secrets", "mutatingwebhookconfigurations",
                                                 "validatingwebhookconfigurations"}
            assert not written, f"{role['metadata']['name']} still grants {written}"
    # Everything else is the default installation.
    assert len(of_kind(cm_objs, "Deployment", "Service", "PodDisruptionBudget", "ConfigMap")) == 5


# --- against the API server ------------------------------------------------------------------------
def _exists(cluster: ControlPlane, *what: str) -> bool:
    return bool(cluster.kubectl("get", *what, "--ignore-not-found", "-o", "name").strip())


@pytest.fixture(scope="module")
def system_namespace(cluster: ControlPlane) -> Iterator[str]:
    """raygate-system for real (a server-side dry run of namespaced objects needs it to exist);
    removed afterwards unless it was there before."""
    ns = keys.SYSTEM_NAMESPACE
    existed = _exists(cluster, "namespace", ns)
    if not existed:
        cluster.kubectl("create", "namespace", ns)
    yield ns
    if not existed:
        cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")


@pytest.mark.parametrize("overlay", ["default", "cert-manager", "pod-gate-policy", "one-process"])
def test_server_dry_run(cluster: ControlPlane, bundle: Bundle, system_namespace: str, overlay: str) -> None:
    """The API server accepts every object (schema, webhook and RBAC validation; the pod gate's CEL compiles), and a
    dry run persists nothing."""
    objs = render(bundle, overlay)
    if overlay in ("default", "pod-gate-policy", "one-process"):
        out = cluster.kubectl("apply", "-k", str(CONFIG / overlay), "--dry-run=server")
    else:
        # No cert-manager CRDs in the test cluster: dry-run everything else the overlay changes.
        objs = [o for o in objs if not o["apiVersion"].startswith("cert-manager.io/")]
        out = cluster.kubectl("apply", "-f", "-", "--dry-run=server", input_text=dump(objs))
    applied = [ln for ln in out.splitlines() if ln.endswith("(server dry run)")]
    assert len(applied) == len(objs), out
    assert not _exists(cluster, "mutatingwebhookconfiguration", keys.MUTATING_WEBHOOK_CONFIG)
    assert not _exists(cluster, "mutatingadmissionpolicy", podgate_policy.POLICY_NAME)
    assert not _exists(cluster, "deployment", "raygate-webhook", "-n", system_namespace)


@pytest.fixture(scope="module")
def installed_rbac(cluster: ControlPlane, bundle: Bundle, system_namespace: str) -> Iterator[None]:
    """The default installation's identities and grants, applied for real (and nothing else: the
    webhook configurations would gate every test's Ray jobs)."""
    rbac = of_kind(render(bundle, "default"), *RBAC_KINDS)
    rbac = [o for o in rbac if o["kind"] != "Namespace"]  # system_namespace owns it
    cluster.kubectl("apply", "-f", "-", input_text=dump(rbac))
    yield
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input_text=dump(rbac))


ML = "ml-team"  # an opted-in user namespace; `can-i` does not need it to exist
SYS = keys.SYSTEM_NAMESPACE
WH = keys.WEBHOOK_SERVICE_ACCOUNT
RC = keys.RECONCILER_SERVICE_ACCOUNT
BOTH = (WH, RC)
CLUSTER = ""  # a cluster-scoped resource: no namespace
ALL = "*"  # every namespace (--all-namespaces)
TLS = f"secrets/{keys.TLS_SECRET}"
MWC = f"mutatingwebhookconfigurations.admissionregistration.k8s.io/{keys.MUTATING_WEBHOOK_CONFIG}"
VWC = f"validatingwebhookconfigurations.admissionregistration.k8s.io/{keys.VALIDATING_WEBHOOK_CONFIG}"
MAP = "mutatingadmissionpolicies.admissionregistration.k8s.io"
MAP_BINDINGS = "mutatingadmissionpolicybindings.admissionregistration.k8s.io"
LEASES = "leases.coordination.k8s.io"
RAYJOBS = "rayjobs.ray.io"
RAYCLUSTERS = "rayclusters.ray.io"
EVENTS = ("events", "events.events.k8s.io")
GANG_PODGROUPS, GANG_WORKLOADS = "podgroups.scheduling.k8s.io", "workloads.scheduling.k8s.io"

# (service account, verb, resource[/name], namespace)
Case = tuple[str, str, str, str]


def _cases(sas: tuple[str, ...], verbs: str, resources: tuple[str, ...], ns: str) -> list[Case]:
    return [(sa, v, r, ns) for sa in sas for v in verbs.split() for r in resources]


ALLOWED: list[Case] = [
    # certificates (both: the init container and the reconciler's renewal)
    *_cases(BOTH, "get update patch", (TLS,), SYS),
    *_cases(BOTH, "create", ("secrets",), SYS),
    *_cases(BOTH, "get update patch", (MWC, VWC), CLUSTER),
    # webhook: config and namespace caches, Events on its ConfigMap
    *_cases((WH,), "get list watch", ("configmaps",), SYS),
    *_cases((WH,), "get list watch", ("namespaces",), CLUSTER),
    *_cases((WH,), "list watch", ("resourceclaimtemplates.resource.k8s.io",), ALL),
    *_cases((WH,), "list watch", (GANG_PODGROUPS,), ALL),  # native mode: raygate's PodGroups, from a cache
    *_cases((WH,), "create patch", EVENTS, SYS),
    # reconciler
    *_cases((RC,), "get list watch patch update", (RAYJOBS, RAYCLUSTERS), ML),
    *_cases((RC,), "get list watch create delete",
            ("provisioningrequests.autoscaling.x-k8s.io", "podtemplates", "podgroups.scheduling.volcano.sh"), ML),
    # Its informers list and watch jobs and children in every namespace at once (no namespace in the path).
    *_cases((RC,), "list watch", (RAYJOBS, RAYCLUSTERS, "provisioningrequests.autoscaling.x-k8s.io", "podtemplates",
                                  "podgroups.scheduling.volcano.sh"), ALL),
    *_cases((RC,), "get list watch create delete", (GANG_WORKLOADS, GANG_PODGROUPS), ML),
    *_cases((RC,), "patch", (GANG_PODGROUPS,), ML),  # the record of the bound gang, an annotation
    *_cases((RC,), "list watch", (GANG_WORKLOADS, GANG_PODGROUPS), ALL),
    *_cases((RC,), "get list watch", ("queues.scheduling.volcano.sh",), CLUSTER),
    *_cases((RC,), "create patch", EVENTS, ML),
    *_cases((RC,), "list watch", ("events",), ALL),  # the cluster-autoscaler's NotTriggerScaleUp words
    *_cases((RC,), "get update", (f"{LEASES}/{keys.LEADER_LEASE}",), SYS),
    *_cases((RC,), "create", (LEASES,), SYS),
    *_cases((RC,), "get list watch", ("configmaps",), SYS),
    *_cases((RC,), "get list watch", ("namespaces",), CLUSTER),
    *_cases((RC,), "get list watch", ("priorityclasses.scheduling.k8s.io",), CLUSTER),  # a job's place in its queue
    # Bookings live as long as their pods; DRA claims are counted from their templates.
    *_cases((RC,), "list watch", ("pods", "resourceclaimtemplates.resource.k8s.io"), ALL),
    *_cases((RC,), "get patch", ("pods",), ML),
    *_cases((RC,), "patch", ("provisioningrequests.autoscaling.x-k8s.io/status",), ML),  # a booking consumed
    *_cases((RC,), "get", ("jobs.batch",), ML),  # a pod of a Job from before raygate stamped Jobs
    *_cases((RC,), "get patch", (f"{MAP}/raygate-pod-gate",), CLUSTER),  # the config, into the pod gate's policy
]

DENIED: list[Case] = [
    # Secrets: nothing outside raygate-system, nothing cluster-wide, no other Secret inside it.
    *_cases(BOTH, "get list watch", ("secrets",), "default"),
    *_cases(BOTH, "get list watch", ("secrets",), "kube-system"),
    *_cases(BOTH, "get list watch", ("secrets",), ALL),
    *_cases(BOTH, "get update", ("secrets/another-secret",), SYS),
    *_cases(BOTH, "list watch", ("secrets",), SYS),
    *_cases(BOTH, "delete", (TLS,), SYS),
    # KubeRay owns status, and nobody deletes users' jobs.
    *_cases(BOTH, "update patch", (f"{RAYJOBS}/status", f"{RAYCLUSTERS}/status"), ML),
    *_cases(BOTH, "delete", (RAYJOBS, RAYCLUSTERS), ML),
    # Only raygate's own webhook configurations, and never created or deleted.
    *_cases(BOTH, "patch", ("mutatingwebhookconfigurations.admissionregistration.k8s.io/other-webhook",
                            "validatingwebhookconfigurations.admissionregistration.k8s.io/other-webhook"), CLUSTER),
    *_cases(BOTH, "create", ("mutatingwebhookconfigurations.admissionregistration.k8s.io",), CLUSTER),
    *_cases(BOTH, "delete", (MWC, VWC), CLUSTER),
    # The pod gate's policy: only raygate's own, never created, deleted or rebound (its binding says where it acts).
    *_cases(BOTH, "create", (MAP, MAP_BINDINGS), CLUSTER),
    *_cases(BOTH, "patch update delete", (f"{MAP}/another-policy", f"{MAP_BINDINGS}/raygate-pod-gate"), CLUSTER),
    *_cases(BOTH, "delete update", (f"{MAP}/raygate-pod-gate",), CLUSTER),
    *_cases((WH,), "patch", (f"{MAP}/raygate-pod-gate",), CLUSTER),
    *_cases(BOTH, "create delete update", ("pods",), ML),
    *_cases((WH,), "patch", ("pods",), ML),
    *_cases(BOTH, "create update patch delete", ("jobs.batch",), ML),
    *_cases((RC,), "list watch", ("jobs.batch",), ALL),  # Jobs are read one at a time, only for old pods
    *_cases((WH,), "list watch", ("pods",), ALL),
    *_cases(BOTH, "create update delete", ("resourceclaimtemplates.resource.k8s.io",), ML),
    *_cases(BOTH, "update delete", ("configmaps",), SYS),
    *_cases(BOTH, "get", ("configmaps",), ML),
    # The webhook answers from caches: it writes no Ray object, gang object or Event outside its namespace.
    *_cases((WH,), "get patch update", (RAYJOBS, RAYCLUSTERS), ML),
    *_cases((WH,), "create", ("provisioningrequests.autoscaling.x-k8s.io", "podgroups.scheduling.volcano.sh",
                              GANG_PODGROUPS, GANG_WORKLOADS), ML),
    *_cases((WH,), "create", EVENTS, ML),
    *_cases((WH,), "create get", (LEASES,), SYS),
    # The reconciler's other limits.
    *_cases((RC,), "update patch", ("provisioningrequests.autoscaling.x-k8s.io", "podgroups.scheduling.volcano.sh",
                                    GANG_WORKLOADS), ML),
    *_cases((RC,), "update", (GANG_PODGROUPS,), ML),
    *_cases((RC,), "update", ("provisioningrequests.autoscaling.x-k8s.io/status",), ML),
    *_cases((RC,), "create update", ("queues.scheduling.volcano.sh",), CLUSTER),
    *_cases((RC,), "update delete", (f"{LEASES}/another-lease",), SYS),
    *_cases((RC,), "create", (LEASES,), ML),
    *_cases((RC,), "update patch delete", ("namespaces",), CLUSTER),
]


def _review(cluster: ControlPlane, sa: str, verb: str, resource: str, ns: str) -> bool:
    """A SubjectAccessReview asked directly: RBAC answers for an API the server does not serve too (the
    shared control plane runs without Kubernetes' gang scheduling), where `kubectl auth can-i` cannot."""
    plural, _, group = resource.partition(".")
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{sa}",
                       "groups": ["system:authenticated"],
                       "resourceAttributes": {"group": group, "resource": plural, "verb": verb,
                                              "namespace": "" if ns in (ALL, CLUSTER) else ns}}}
    out = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input_text=json.dumps(review)))
    return bool(out["status"].get("allowed"))


def can_i(cluster: ControlPlane, sa: str, verb: str, resource: str, ns: str) -> bool:
    if resource in (GANG_PODGROUPS, GANG_WORKLOADS):
        return _review(cluster, sa, verb, resource, ns)
    target, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb]
    if sub == "status":
        args += [target, "--subresource=status"]
    else:
        args.append(resource)
    if ns == ALL:
        args.append("--all-namespaces")
    elif ns:
        args += ["-n", ns]
    args.append(f"--as=system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{sa}")
    proc = subprocess.run(
        [str(cluster.bundle.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True, text=True, check=False,
    )
    answer = proc.stdout.strip()
    # A resource the server does not know is answered "no" with a warning: that would make a
    # denial case pass for the wrong reason, so it is an error here.
    assert "doesn't have a resource type" not in proc.stderr, proc.stderr
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def _id(case: Case) -> str:
    sa, verb, resource, ns = case
    where = {CLUSTER: "cluster", ALL: "all-namespaces"}.get(ns, ns)
    return f"{sa.removeprefix('raygate-')}-{verb}-{resource}-{where}"


@pytest.mark.usefixtures("installed_rbac")
@pytest.mark.parametrize("case", ALLOWED, ids=[_id(c) for c in ALLOWED])
def test_service_account_may(cluster: ControlPlane, case: Case) -> None:
    assert can_i(cluster, *case), f"{case[0]} must be allowed to {case[1]} {case[2]} ({case[3] or 'cluster'})"


@pytest.mark.usefixtures("installed_rbac")
@pytest.mark.parametrize("case", DENIED, ids=[_id(c) for c in DENIED])
def test_service_account_may_not(cluster: ControlPlane, case: Case) -> None:
    assert not can_i(cluster, *case), f"{case[0]} must not {case[1]} {case[2]} ({case[3] or 'cluster'})"
