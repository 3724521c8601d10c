"""Every label, annotation, name and API coordinate raygate reads or writes, defined once.

Both the webhook and the reconciler import from here, so a key can never drift between them.
"""

from __future__ import annotations

from enum import StrEnum

# --- raygate's own vocabulary -------------------------------------------------------------
DOMAIN = "raygate.io"
OPT_IN_LABEL = f"{DOMAIN}/gang-admission"
OPT_IN_VALUE = "enabled"
STATE_LABEL = f"{DOMAIN}/state"
POD_GROUP_ANNOTATION = f"{DOMAIN}/pod-group"  # JSON PodGroup spec recorded by the webhook
MODE_ANNOTATION = f"{DOMAIN}/mode"  # the mode the webhook applied
REQUEST_ANNOTATION = f"{DOMAIN}/provisioning-request"
ATTEMPT_ANNOTATION = f"{DOMAIN}/attempt"
REASON_ANNOTATION = f"{DOMAIN}/reason"
NEXT_ATTEMPT_ANNOTATION = f"{DOMAIN}/next-attempt-after"
ADMITTED_AT_ANNOTATION = f"{DOMAIN}/admitted-at"
# On a ProvisioningRequest: the fingerprint of the pod sets it books (names, counts, templates).
POD_SETS_ANNOTATION = f"{DOMAIN}/pod-sets"
# Per-job ProvisioningRequest parameter overrides: provreq.raygate.io/<Parameter>: value
PROVREQ_PARAM_PREFIX = "provreq.raygate.io/"
# On the objects the reconciler creates (PodTemplates, ProvisioningRequests, PodGroups), so its
# watches see only its own children.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "raygate"


class ChildKind(StrEnum):
    """The kinds of object the reconciler creates for a job (owned by it, labelled managed-by raygate), in
    the order they are deleted: a request before the templates it names."""

    PROVISIONING_REQUEST = "ProvisioningRequest"
    POD_TEMPLATE = "PodTemplate"
    POD_GROUP = "PodGroup"  # Volcano's


class State(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    ADMITTED = "Admitted"
    FAILED = "Failed"


HELD_STATES = frozenset({State.PENDING, State.PROVISIONING})

# --- KubeRay (ray.io/v1) --------------------------------------------------------------------
RAY_GROUP = "ray.io"
RAY_VERSION = "v1"
RAYJOB_KIND = "RayJob"
RAYCLUSTER_KIND = "RayCluster"
RAYJOB_PLURAL = "rayjobs"
RAYCLUSTER_PLURAL = "rayclusters"
ORIGINATED_FROM_CRD_LABEL = "ray.io/originated-from-crd"
ORIGINATED_FROM_NAME_LABEL = "ray.io/originated-from-cr-name"
RAY_PRIORITY_CLASS_LABEL = "ray.io/priority-class-name"
RAY_CLUSTER_LABEL = "ray.io/cluster"
HEAD_GROUP_TASK = "headgroup"
SUBMITTER_TASK = "submittergroup"
# KubeRay's defaults for pods it adds that are not in any template.
AUTOSCALER_DEFAULT_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
SUBMITTER_DEFAULT_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
SUBMITTER_DEFAULT_LIMITS = {"cpu": "1", "memory": "1Gi"}
MAX_REPLICAS_DEFAULT = 2147483647

# --- Kueue ------------------------------------------------------------------------------------
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
KUEUE_MAX_WORKER_GROUPS = 17

# --- Volcano ----------------------------------------------------------------------------------
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_VERSION = "v1beta1"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_QUEUE_LABEL = "volcano.sh/queue-name"
VOLCANO_GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_TASK_SPEC_ANNOTATION = "volcano.sh/task-spec"

# --- ProvisioningRequest (cluster-autoscaler) -------------------------------------------------
PROVREQ_GROUP = "autoscaling.x-k8s.io"
PROVREQ_VERSIONS = ("v1", "v1beta1")  # preferred first
PROVREQ_PLURAL = "provisioningrequests"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
CHECK_CAPACITY_CLASS = "check-capacity.autoscaling.x-k8s.io"
PROVREQ_MAX_POD_SETS = 32
PROVREQ_MAX_PARAM_LEN = 255

# --- raygate's installation -------------------------------------------------------------------
SYSTEM_NAMESPACE = "raygate-system"
CONFIGMAP_NAME = "raygate-config"
CONFIGMAP_KEY = "config.yaml"
WEBHOOK_SERVICE = "raygate-webhook"
WEBHOOK_PORT = 9443
TLS_SECRET = "raygate-webhook-tls"
MUTATING_WEBHOOK_CONFIG = "raygate-mutating"
VALIDATING_WEBHOOK_CONFIG = "raygate-validating"
WEBHOOK_SERVICE_ACCOUNT = "raygate-webhook"
RECONCILER_SERVICE_ACCOUNT = "raygate-reconciler"
LEADER_LEASE = "raygate-reconciler"
