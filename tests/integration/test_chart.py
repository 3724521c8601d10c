"""The Helm chart (charts/raygate): `helm lint`, `helm template` compared object by object with
`kubectl kustomize config/default` and config/cert-manager, its values schema refusing what
raygate's config model refuses, and `helm install` / `helm uninstall` against the real API server,
compared with `kubectl apply -k config/default` on the same server."""

from __future__ import annotations

import copy
import difflib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import wait

from raygate.core import keys
from raygate.core.config import parse_config
from raygate.core.policy import ConfigError, RaygateConfig
from raygate.devenv.build import Bundle
from raygate.devenv.controlplane import ControlPlane

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "raygate"
CONFIG = ROOT / "config"
NS = keys.SYSTEM_NAMESPACE
RELEASE = "raygate"
Obj = dict[str, Any]
Key = tuple[str, str]  # (kind, name): every name is unique per kind in an installation

# What the tools themselves add, and what the API server fills in per object.
TOOL_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", "meta.helm.sh/release-name",
                    "meta.helm.sh/release-namespace", "deployment.kubernetes.io/revision")
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


# --- helpers ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's cache, config and data directories inside the test's temporary directory."""
    home = tmp_path_factory.mktemp("helm")
    return {**os.environ, **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}


def helm(bundle: Bundle, env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(bundle.binary("helm")), *args], capture_output=True, text=True, env=env, check=False)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed: {proc.stderr}"
    return proc


def template(bundle: Bundle, env: dict[str, str], *values: str) -> list[Obj]:
    out = helm(bundle, env, "template", RELEASE, str(CHART), "--namespace", NS, *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kustomize(bundle: Bundle, overlay: str) -> list[Obj]:
    proc = subprocess.run([str(bundle.binary("kubectl")), "kustomize", str(CONFIG / overlay)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def key(obj: Obj) -> Key:
    return obj["kind"], obj["metadata"]["name"]


def normalize(obj: Obj) -> Obj:
    """The object without what only says which tool applied it (managed-by, the tools' annotations)
    or what the server assigns it; config.yaml as raygate reads it (comments and key order aside)."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    for f in SERVER_FIELDS:
        meta.pop(f, None)
    obj.pop("status", None)
    labels = meta.get("labels", {})
    assert labels.pop("app.kubernetes.io/managed-by", None) in (None, "kustomize", "Helm"), meta
    annotations = {k: v for k, v in meta.pop("annotations", {}).items() if k not in TOOL_ANNOTATIONS}
    if annotations:
        meta["annotations"] = annotations
    if obj["kind"] == "Service":
        for f in ("clusterIP", "clusterIPs"):
            obj["spec"].pop(f, None)
    if obj["kind"] == "ConfigMap" and keys.CONFIGMAP_KEY in obj.get("data", {}):
        obj["data"][keys.CONFIGMAP_KEY] = parse_config(obj["data"][keys.CONFIGMAP_KEY]).model_dump(by_alias=True)
    return obj


def by_key(objs: list[Obj]) -> dict[Key, Obj]:
    out = {key(o): normalize(o) for o in objs}
    assert len(out) == len(objs), "two objects of one kind share a name"
    return out


def assert_same(ours: dict[Key, Obj], theirs: dict[Key, Obj], what: str) -> None:
    assert sorted(ours) == sorted(theirs), f"{what}: objects differ: only chart {sorted(set(ours) - set(theirs))}, " \
                                           f"only kustomize {sorted(set(theirs) - set(ours))}"
    for k in ours:
        if ours[k] != theirs[k]:
            diff = difflib.unified_diff(yaml.safe_dump(theirs[k]).splitlines(), yaml.safe_dump(ours[k]).splitlines(),
                                        "kustomize", "chart", lineterm="")
            pytest.fail(f"{what}: {k[0]}/{k[1]} differs:\n" + "\n".join(diff))


def configmap(objs: list[Obj]) -> str:
    (cm,) = [o for o in objs if key(o) == ("ConfigMap", keys.CONFIGMAP_NAME)]
    return str(cm["data"][keys.CONFIGMAP_KEY])


# --- lint and template -----------------------------------------------------------------------------
@pytest.mark.parametrize("values", [[], ["--set", "certManager.enabled=true", "--set", "oneProcess.enabled=true",
                                         "--set", "monitoring.prometheusRule.enabled=true", "--set",
                                         "monitoring.dashboard.enabled=true"]], ids=["default", "everything-on"])
def test_lint(bundle: Bundle, helm_env: dict[str, str], values: list[str]) -> None:
    out = helm(bundle, helm_env, "lint", "--strict", str(CHART), "--namespace", NS, *values).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


POLICY_SERVED = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]


@pytest.mark.parametrize(("overlays", "values"),
                         [(["default"], []), (["cert-manager"], ["--set", "certManager.enabled=true"]),
                          (["default", "pod-gate-policy"], POLICY_SERVED),
                          (["one-process"], ["--set", "oneProcess.enabled=true"])],
                         ids=["default", "cert-manager", "kubernetes-1.36", "one-process"])
def test_template_renders_the_kustomize_objects(
    bundle: Bundle, helm_env: dict[str, str], overlays: list[str], values: list[str]
) -> None:
    """One source of truth: the chart's default output is config/<overlay>, object for object (the
    Namespace aside: Helm keeps its release record in it, so it is created before the install); where the
    cluster serves MutatingAdmissionPolicy, with config/pod-gate-policy too."""
    theirs = [o for overlay in overlays for o in kustomize(bundle, overlay) if o["kind"] != "Namespace"]
    assert_same(by_key(template(bundle, helm_env, *values)), by_key(theirs), " + ".join(overlays))


def test_template_refuses_another_namespace(bundle: Bundle, helm_env: dict[str, str]) -> None:
    proc = helm(bundle, helm_env, "template", RELEASE, str(CHART), "--namespace", "default", check=False)
    assert proc.returncode != 0
    assert "raygate installs into namespace raygate-system" in proc.stderr, proc.stderr


def test_monitoring_is_optional_and_ships_config_monitoring(bundle: Bundle, helm_env: dict[str, str]) -> None:
    assert not [o for o in template(bundle, helm_env) if o["kind"] == "PrometheusRule" or
                key(o) == ("ConfigMap", "raygate-dashboard")]
    ours = [o for o in template(bundle, helm_env, "--set", "monitoring.prometheusRule.enabled=true",
                                "--set", "monitoring.dashboard.enabled=true")
            if o["kind"] == "PrometheusRule" or key(o) == ("ConfigMap", "raygate-dashboard")]
    assert_same(by_key(ours), by_key(kustomize(bundle, "monitoring")), "monitoring")


# --- values: config.yaml, namespace selector, KubeRay operator identity ----------------------------
@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"defaults": {"mode": "bogus"}}, "at '/config/defaults/mode'"),
        ({"defaultz": {"mode": "kueue"}}, "additional properties 'defaultz' not allowed"),
        ({"defaults": {"retry": {"limit": -1}}}, "at '/config/defaults/retry/limit'"),
        ({"defaults": {"provisioning": {"classname": "x"}}}, "additional properties 'classname' not allowed"),
        ({"failurePolicy": "Maybe"}, "at '/config/failurePolicy'"),
        ({"namespaces": {"team-a": "kueue"}}, "at '/config/namespaces/team-a'"),
    ],
)
def test_install_refuses_a_config_the_model_refuses(
    bundle: Bundle, helm_env: dict[str, str], config: Obj, error: str
) -> None:
    with pytest.raises(ConfigError):
        parse_config(json.dumps(config))
    proc = helm(bundle, helm_env, "template", RELEASE, str(CHART), "--namespace", NS,
                "--set-json", f"config={json.dumps(config)}", check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr and error in proc.stderr, proc.stderr


def test_config_value_lands_in_the_configmap(bundle: Bundle, helm_env: dict[str, str]) -> None:
    config = {"defaults": {"mode": "volcano", "queueName": "research", "maxGang": {"nvidia.com/gpu": "64"}},
              "namespaces": {"team-kueue": {"mode": "kueue", "queueName": "lq"}}, "failurePolicy": "Ignore"}
    objs = template(bundle, helm_env, "--set-json", f"config={json.dumps(config)}")
    assert parse_config(configmap(objs)) == parse_config(json.dumps(config))
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = next(o for o in objs if o["kind"] == kind)["webhooks"]
        assert hook["failurePolicy"] == "Ignore"


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    ops = {"In": lambda k, vs: labels.get(k) in vs, "NotIn": lambda k, vs: labels.get(k) not in vs,
           "Exists": lambda k, vs: k in labels, "DoesNotExist": lambda k, vs: k not in labels}
    return all(ops[e["operator"]](e["key"], e.get("values", [])) for e in selector.get("matchExpressions", []))


def test_namespace_selector_value_drives_webhooks_and_config(bundle: Bundle, helm_env: dict[str, str]) -> None:
    selector = {"matchLabels": {"ray.example.com/gang": "on"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}
    objs = template(bundle, helm_env, "--set-json", f"namespaceSelector={json.dumps(selector)}")
    config = parse_config(configmap(objs))
    cases = [
        ({"ray.example.com/gang": "on", "tier": "gpu"}, "team-a", True),
        ({"ray.example.com/gang": "on"}, "team-a", False),
        ({keys.OPT_IN_LABEL: keys.OPT_IN_VALUE, "tier": "gpu"}, "team-a", False),
        ({"ray.example.com/gang": "on", "tier": "gpu"}, "kube-system", False),
        ({"ray.example.com/gang": "on", "tier": "gpu"}, NS, False),
    ]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = next(o for o in objs if o["kind"] == kind)["webhooks"]
        for labels, name, expected in cases:
            ns_labels = {**labels, "kubernetes.io/metadata.name": name}
            assert _selects(hook["namespaceSelector"], ns_labels) is expected, (kind, labels, name)
            assert config.opted_in(name, labels) is expected, (labels, name)


def test_kuberay_operator_identity(bundle: Bundle, helm_env: dict[str, str]) -> None:
    """The default identity is raygate's own default, so config.yaml leaves it out; another one is
    written into rayOperatorUsers, which raygate's config model reads once it has that field."""
    assert "rayOperatorUsers" not in yaml.safe_load(configmap(template(bundle, helm_env)))
    text = configmap(template(bundle, helm_env, "--set", "kuberayOperator.serviceAccount.namespace=kuberay",
                              "--set", "kuberayOperator.serviceAccount.name=operator"))
    assert yaml.safe_load(text)["rayOperatorUsers"] == ["system:serviceaccount:kuberay:operator"]
    field = next((n for n, f in RaygateConfig.model_fields.items() if f.alias == "rayOperatorUsers"), None)
    if field is None:
        # This branch predates the field: raygate refuses the key, as it refuses every unknown key.
        with pytest.raises(ConfigError, match="rayOperatorUsers"):
            parse_config(text)
    else:
        assert getattr(parse_config(text), field) == ["system:serviceaccount:kuberay:operator"]
    proc = helm(bundle, helm_env, "template", RELEASE, str(CHART), "--namespace", NS,
                "--set", "kuberayOperator.serviceAccount.namespace=Not_A_Namespace", check=False)
    assert proc.returncode != 0 and "/kuberayOperator/serviceAccount/namespace" in proc.stderr, proc.stderr


# --- against the API server ------------------------------------------------------------------------
def _live(cluster: ControlPlane, objs: list[Key]) -> dict[Key, Obj]:
    out = {}
    for kind, name in objs:
        args = ["get", kind, name, "-o", "json"]
        if kind not in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                        "ValidatingWebhookConfiguration", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                        "Namespace"):
            args += ["-n", NS]
        out[(kind, name)] = normalize(json.loads(cluster.kubectl(*args)))
    return out


def _gone(cluster: ControlPlane, objs: list[Key]) -> list[Key]:
    """Of `objs`, those the API server still has."""
    left = []
    for kind, name in objs:
        out = cluster.kubectl("get", kind, name, "-n", NS, "--ignore-not-found", "-o", "name")
        if out.strip():
            left.append((kind, name))
    return left


def _namespace_absent(cluster: ControlPlane) -> bool:
    return not cluster.kubectl("get", "namespace", NS, "--ignore-not-found", "-o", "name").strip()


INSTALL = ("default", "pod-gate-policy")  # what the README installs on a cluster that serves the policy


@pytest.fixture(scope="module")
def clean_slate(cluster: ControlPlane) -> Iterator[None]:
    """No raygate objects before (other modules' local runs leave RBAC and the namespace behind) or after."""
    def clean() -> None:
        for overlay in INSTALL:
            cluster.kubectl("delete", "-k", str(CONFIG / overlay), "--ignore-not-found", "--wait=false")
        wait(lambda: _namespace_absent(cluster), 120, f"namespace {NS} to be deleted")

    clean()
    yield
    clean()


@pytest.mark.usefixtures("clean_slate")
def test_install_creates_what_kustomize_creates_and_uninstall_removes_it(
    cluster: ControlPlane, bundle: Bundle, helm_env: dict[str, str]
) -> None:
    expected = [key(o) for overlay in INSTALL for o in kustomize(bundle, overlay)]
    chart_objs = [k for k in expected if k[0] != "Namespace"]

    # kubectl apply -k config/default and config/pod-gate-policy (the control plane is 1.36), for real, as the
    # reference.
    for overlay in INSTALL:
        cluster.kubectl("apply", "-k", str(CONFIG / overlay))
    reference = _live(cluster, chart_objs)
    for overlay in reversed(INSTALL):
        cluster.kubectl("delete", "-k", str(CONFIG / overlay), "--wait=false")
    wait(lambda: _namespace_absent(cluster), 120, f"namespace {NS} to be deleted after kubectl delete -k")

    # The README's Helm install: the namespace first (with its pod-security labels), then the chart.
    env = {**helm_env, "KUBECONFIG": str(cluster.kubeconfig)}
    cluster.kubectl("apply", "-f", str(CONFIG / "base" / "namespace.yaml"))
    helm(bundle, env, "install", RELEASE, str(CHART), "--namespace", NS)
    assert_same(_live(cluster, chart_objs), reference, "helm install vs kubectl apply -k")
    manifest = [d for d in yaml.safe_load_all(helm(bundle, env, "get", "manifest", RELEASE, "-n", NS).stdout) if d]
    assert sorted(key(o) for o in manifest) == sorted(chart_objs), "the release owns exactly these objects"
    # The API server knows whom each object belongs to.
    webhook = json.loads(cluster.kubectl("get", "deployment", "raygate-webhook", "-n", NS, "-o", "json"))
    assert webhook["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE

    # An upgrade with a new config changes the ConfigMap in place (the components watch it).
    helm(bundle, env, "upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values",
         "--set", "config.defaults.mode=kueue", "--set", "config.defaults.queueName=lq")
    cm = json.loads(cluster.kubectl("get", "configmap", keys.CONFIGMAP_NAME, "-n", NS, "-o", "json"))
    assert parse_config(cm["data"][keys.CONFIGMAP_KEY]).defaults.mode == "kueue"

    helm(bundle, env, "uninstall", RELEASE, "--namespace", NS, "--wait")
    wait(lambda: not _gone(cluster, chart_objs), 60, "every object of the release to be deleted")
    assert RELEASE not in helm(bundle, env, "list", "-n", NS, "-q").stdout.split()
    # The namespace was not the release's: it stays until the admin deletes it.
    assert not _namespace_absent(cluster)
