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
# On a held job: the cluster-autoscaler's words (NotTriggerScaleUp) saying no node group can hold a pod of it. The
# job waits out of its queue's way (queues.<name>.neverFits: Hold), its request kept, until it is admitted: once a
# node group is at its maximum the autoscaler says only that, of a job that could never fit as of one that could.
NEVER_FITS_ANNOTATION = f"{DOMAIN}/never-fits"
# On a job raygate suspended to make room for a higher-priority one: "<Kind namespace/name> <time>" of that job.
# While that job is held, this one does not ask before it (it made room for it).
PREEMPTED_BY_ANNOTATION = f"{DOMAIN}/preempted-by"
# On the job that preempted others: "<time> <Kind namespace/name>,..." of the jobs it suspended; it waits for
# their pods to go (capacity freed after <time>) before it preempts again.
PREEMPTING_ANNOTATION = f"{DOMAIN}/preempting"
# The times this attempt's request was withdrawn, or asked again, by the job's queue: part of the request's name.
ROUND_ANNOTATION = f"{DOMAIN}/round"
REASON_ANNOTATION = f"{DOMAIN}/reason"
NEXT_ATTEMPT_ANNOTATION = f"{DOMAIN}/next-attempt-after"
# "<request> <time>": when the autoscaler first answered that request not Provisioned (its retry clock starts)
NOT_PROVISIONED_SINCE_ANNOTATION = f"{DOMAIN}/not-provisioned-since"
ADMITTED_AT_ANNOTATION = f"{DOMAIN}/admitted-at"
# On an admitted RayCluster: when KubeRay took up its unsuspend (the write also wakes KubeRay; admitted.py).
RESUMED_AT_ANNOTATION = f"{DOMAIN}/resumed-at"
# On a ProvisioningRequest: the fingerprint of the pod sets it books (names, counts, templates).
POD_SETS_ANNOTATION = f"{DOMAIN}/pod-sets"
# The pod gate: every GPU pod of a Ray object is created with this scheduling gate (and this label,
# "gated", then "released"); only raygate's reconciler lifts it, against a Provisioned booking.
CAPACITY_GATE = f"{DOMAIN}/capacity"
POD_GATE_LABEL = f"{DOMAIN}/pod-gate"
POD_GATED = "gated"
POD_RELEASED = "released"
# Whose a pod is, decided once when it is created (raygate/core/identity.py): on a pod, and in the pod template of
# a batch Job KubeRay's operator makes (the Job controller copies it into every pod), the Ray object whose booking
# the pod may use, "<kind>/<name>/<uid>/<pod set>", or "none". On the objects the reconciler creates: their job,
# "<kind>/<name>/<uid>", so that one the garbage collector orphaned is still raygate's to clean up.
RAY_OWNER_ANNOTATION = f"{DOMAIN}/ray-owner"
# On KubeRay's RayCluster of a RayJob: that RayJob, "RayJob/<name>/<uid>", recorded when KubeRay's operator creates it.
PARENT_ANNOTATION = f"{DOMAIN}/parent"
# On a ProvisioningRequest that books a scale-up (pods beyond the admitted gang), and on the PodGroup of a
# scale-up's increment (native mode): its pod set's name.
SCALE_UP_ANNOTATION = f"{DOMAIN}/scale-up"
# On a Ray object: why its latest scale-up waits (pods gated until their request is Provisioned).
SCALE_UP_REASON_ANNOTATION = f"{DOMAIN}/scale-up-reason"
# On the PodTemplates raygate makes: the pod set they stand for and a digest of where its pods fit,
# so a pod is matched only to a booking made for pods like it.
POD_SET_ANNOTATION = f"{DOMAIN}/pod-set"
PLACEMENT_ANNOTATION = f"{DOMAIN}/placement"
# Per-job ProvisioningRequest parameter overrides: provreq.raygate.io/<Parameter>: value
PROVREQ_PARAM_PREFIX = "provreq.raygate.io/"
# On the objects the reconciler creates (PodTemplates, ProvisioningRequests, PodGroups), so its
# watches see only its own children.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "raygate"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"


class ChildKind(StrEnum):
    """The kinds of object the reconciler creates for a job (owned by it, labelled managed-by raygate), in
    the order they are deleted: a request before the templates it names, a PodGroup before its Workload."""

    PROVISIONING_REQUEST = "ProvisioningRequest"
    POD_TEMPLATE = "PodTemplate"
    POD_GROUP = "PodGroup"  # Volcano's
    GANG_POD_GROUP = "PodGroup.scheduling.k8s.io"  # Kubernetes' own (native mode): its kind is PodGroup too
    WORKLOAD = "Workload"  # Kubernetes' own (native mode)


# What raygate does in a namespace (NamespacePolicy.mode); each mode's rules are its class in raygate.core.modes.
# (A comment, not a docstring: the chart's values.schema.json would carry a docstring as the enum's description.)
class Mode(StrEnum):
    PROVISIONING = "provisioning"
    VOLCANO = "volcano"
    KUEUE = "kueue"
    NATIVE = "native"


class QueueStrategy(StrEnum):
    """How a queue's held jobs take their turn (raygate.core.queueing)."""

    STRICT_FIFO = "StrictFIFO"  # only the head asks the autoscaler; nobody passes it
    BEST_EFFORT_FIFO = "BestEffortFIFO"  # jobs behind a head answered "not now" may try; the head asks first again


class NeverFits(StrEnum):
    """What becomes of a held job the cluster could never hold (no node group fits one of its pods)."""

    HOLD = "Hold"  # it stays held, with the autoscaler's words, out of its queue's way
    FAIL = "Fail"  # state Failed, with the autoscaler's words


class Preemption(StrEnum):
    """Whether the job at the front of a queue may suspend running jobs of its queue to make room."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"  # running jobs of strictly lower priority, the fewest that cover its gang


DEFAULT_QUEUE = "default"


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
RAY_NODE_TYPE_LABEL = "ray.io/node-type"  # on every head and worker pod KubeRay creates (not overridable)
RAY_GROUP_LABEL = "ray.io/group"  # the pod's group: headgroup or the worker group's name (not overridable)
# A RayCluster's status condition, False once KubeRay saw it unsuspended (status.state still says "suspended"
# until its pods come).
RAYCLUSTER_SUSPENDED_CONDITION = "RayClusterSuspended"
RAYCLUSTER_SUSPENDED_STATE = "suspended"
KUBERAY_CREATED_BY = ("app.kubernetes.io/created-by", "kuberay-operator")  # on the batch Jobs KubeRay makes
HEAD_GROUP_TASK = "headgroup"
SUBMITTER_TASK = "submittergroup"
# KubeRay's defaults for pods it adds that are not in any template.
AUTOSCALER_DEFAULT_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
SUBMITTER_DEFAULT_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
SUBMITTER_DEFAULT_LIMITS = {"cpu": "1", "memory": "1Gi"}
MAX_REPLICAS_DEFAULT = 2147483647

# --- DRA (resource.k8s.io/v1) ---------------------------------------------------------------------
DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
# How raygate names, in a gang's resources, the devices of one DeviceClass a pod claims through DRA:
# resource.k8s.io/<DeviceClass>. Never written to the cluster: Volcano and the autoscaler count resources.
DRA_RESOURCE_PREFIX = f"{DRA_GROUP}/"

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

# --- Kubernetes' own gang scheduling (KEP-4671: Workload and PodGroup) -----------------------------
GANG_GROUP = "scheduling.k8s.io"
GANG_VERSIONS = ("v1beta1", "v1alpha2")  # preferred first: 1.37 serves v1beta1 and removes v1alpha2
GANG_RESOURCES = ("workloads", "podgroups")  # both must be served (scheduling.k8s.io/v1beta1 was once PriorityClass)
GANG_TEMPLATE = "gang"  # the one PodGroupTemplate of the Workload raygate makes
GANG_PROTECTION_FINALIZER = "scheduling.k8s.io/podgroup-protection"  # kept until the group's pods are terminal
GANG_SCHEDULED_CONDITION = "PodGroupScheduled"  # set by kube-scheduler on the PodGroup
# On a pod template of a job admitted in native mode (the reconciler writes it in the patch that unsuspends
# it): the PodGroup its pods join. The pod webhook reads it from the pod at CREATE and writes
# spec.schedulingGroup.podGroupName (KubeRay's CRDs prune that field from templates, and it is immutable
# once the pod exists).
GANG_GROUP_ANNOTATION = f"{DOMAIN}/gang-group"
# On the gang's PodGroup (native mode; the reconciler writes it): the Ray cluster whose gang kube-scheduler
# bound, minCount of its pods at once. From then on the pod webhook puts that cluster's new gated pods (a
# scale-up, a restart) into PodGroups of their own; another cluster's (a RayJob's retry) still join the gang's.
GANG_BOUND_ANNOTATION = f"{DOMAIN}/gang-bound"
POD_GROUP_NAME_PATH = ("spec", "schedulingGroup", "podGroupName")  # where a pod names its PodGroup
# What a cluster needs to serve and run it (Kubernetes 1.36), as the flags of each component.
GANG_APISERVER_FLAGS = ("--feature-gates=GenericWorkload=true", "--runtime-config=scheduling.k8s.io/v1alpha2=true")
GANG_CONTROLLER_MANAGER_FLAGS = ("--feature-gates=GenericWorkload=true",)
GANG_SCHEDULER_FLAGS = ("--feature-gates=GenericWorkload=true,GangScheduling=true",)
GANG_PROTECTION_CONTROLLER = "podgroup-protection-controller"  # kube-controller-manager's, behind GenericWorkload

# --- ProvisioningRequest (cluster-autoscaler) -------------------------------------------------
PROVREQ_GROUP = "autoscaling.x-k8s.io"
PROVREQ_VERSIONS = ("v1", "v1beta1")  # preferred first
PROVREQ_PLURAL = "provisioningrequests"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
CHECK_CAPACITY_CLASS = "check-capacity.autoscaling.x-k8s.io"
BEST_EFFORT_ATOMIC_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
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
