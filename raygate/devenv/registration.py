"""The MutatingWebhookConfiguration and ValidatingWebhookConfiguration raygate registers.

config/base carries the same objects as YAML for a cluster install (a test keeps the two in step);
this builder serves the local control plane, where the webhook is reached by URL.
"""

from __future__ import annotations

import base64
from typing import Any

from raygate.core import keys, podgate_policy
from raygate.core.policy import DEFAULT_CONFIG

TIMEOUT_SECONDS = 5
# The guard always lets raygate's reconciler through, so the API server need not ask: skipping the
# round trip on its two writes per admitted job took the 1,000-job Provisioned -> unsuspended p99
# from about 3 s to about 1.2 s on a 2-core machine.
SKIP_RECONCILER = {
    "name": "not-raygate-reconciler",
    "expression": "request.userInfo.username != "
    f"'system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}'",
}

# A pod created with raygate's gate already on (the mutating webhook put it there, and no later one took it off)
# and naming no booking passes validation for sure, unless it names a native-mode gang but not its PodGroup
# (webhook/pods.py validate()): the API server need not send it. That is every GPU pod of an admitted gang, so it
# halves the webhook calls of each of KubeRay's pod creates (one AdmissionReview, the mutating one, instead of
# two). What it gives up: validation also compares the pod's ray-owner record with what raygate's mutation wrote,
# which only a mutating webhook ordered after raygate's (an admin's, as trusted as the API server) could change.
SKIP_GATED_POD_CREATE = {
    "name": "not-a-gated-pod-create",
    "expression": f"!({podgate_policy.IS_POD_CREATE} && {podgate_policy.GATED} && "
    f"!({podgate_policy.NAMES_A_BOOKING}) && !({podgate_policy.GANG_NOT_NAMED}))",
}


def namespace_selector() -> dict[str, Any]:
    # Opt-in by label; kube-system and raygate's own namespace are excluded even if labelled.
    return {
        "matchExpressions": [
            {"key": keys.OPT_IN_LABEL, "operator": "In", "values": [keys.OPT_IN_VALUE]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
             "values": ["kube-system", keys.SYSTEM_NAMESPACE]},
        ],
    }


def _webhook(name: str, client_config: dict[str, Any], operations: list[str], failure_policy: str,
             pod_operations: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": client_config,
        "rules": [
            {"apiGroups": [keys.RAY_GROUP], "apiVersions": [keys.RAY_VERSION], "operations": operations,
             "resources": [keys.RAYJOB_PLURAL, keys.RAYCLUSTER_PLURAL], "scope": "Namespaced"},
            # The pod gate (raygate/core/podgate.py).
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": pod_operations, "resources": ["pods"],
             "scope": "Namespaced"},
            # KubeRay's batch Jobs: the Ray object their pods serve, stamped at CREATE (raygate/core/identity.py).
            {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": pod_operations, "resources": ["jobs"],
             "scope": "Namespaced"},
        ],
        "namespaceSelector": namespace_selector(),
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "admissionReviewVersions": ["v1"],
    }


# A pod KubeRay's operator creates that arrives as the webhook would leave it (the pod gate's policy gated it,
# raygate/core/podgate_policy.py) is not sent to /mutate: each of KubeRay's GPU pods then costs no webhook call.
SKIP_ALREADY_GATED = podgate_policy.skip_already_gated(DEFAULT_CONFIG.ray_operator_users)


def configurations(url: str, ca_pem: bytes, failure_policy: str = "Fail") -> tuple[dict[str, Any], dict[str, Any]]:
    """(mutating, validating) for a webhook served at `url` (https://host:port) with CA `ca_pem`."""
    ca = base64.b64encode(ca_pem).decode()
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": keys.MUTATING_WEBHOOK_CONFIG},
        "webhooks": [{
            # UPDATE: the KubeRay operator's updates of a RayService's cluster keep raygate's hold and record.
            **_webhook("mutate.raygate.io", {"url": f"{url}/mutate", "caBundle": ca}, ["CREATE", "UPDATE"],
                       failure_policy, ["CREATE"]),
            "matchConditions": [SKIP_ALREADY_GATED],
            "reinvocationPolicy": "Never",
        }],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": keys.VALIDATING_WEBHOOK_CONFIG},
        "webhooks": [{
            **_webhook("validate.raygate.io", {"url": f"{url}/validate", "caBundle": ca}, ["CREATE", "UPDATE"],
                       failure_policy, ["CREATE", "UPDATE"]),
            "matchConditions": [SKIP_RECONCILER, SKIP_GATED_POD_CREATE],
        }],
    }
    return mutating, validating


def pod_gate_policy() -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod gate's MutatingAdmissionPolicy as installed (it matches no pod until the reconciler writes the
    config into it) and its binding, for clusters that serve it (Kubernetes 1.36+)."""
    return podgate_policy.policy(None), podgate_policy.binding(namespace_selector())
