"""The admin's policy: ConfigMap `raygate-config`, key `config.yaml`, parsed into strict models.

Unknown keys are rejected, fields are camelCase, and every error names its field path, so an admin
sees exactly what to change. Per-namespace overrides are merged over `defaults` and validated as a
whole, so a bad override is reported under `namespaces.<name>.<field>`.

The models are data: they name a mode and know nothing of it. What a mode makes of a policy (whether it
books by default, which settings it cannot run with, what the cluster must serve for it) is the mode's,
asked by the loader above the modes (raygate.core.config) and by raygate.core.modes.for_object.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from raygate.core import keys, quantity
from raygate.core.keys import Mode

PROTECTED_NAMESPACES = frozenset({"kube-system", keys.SYSTEM_NAMESPACE})
# GPUs as the device plugins name them: NVIDIA's whole GPUs and its MIG slices (one resource per slice
# profile, nvidia.com/mig-1g.10gb and so on, when the device plugin's MIG strategy is "mixed"), and AMD's.
DEFAULT_MANAGED_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu")
# The DeviceClasses the DRA drivers of the same vendors install: NVIDIA's GPUs and MIG slices, AMD's GPUs.
DEFAULT_MANAGED_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "gpu.amd.com")
# A resource name (an optional DNS prefix and a name), or the start of one followed by a single *.
_RESOURCE_PATTERN = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?"  # prefix/
    r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?|[-A-Za-z0-9_.]*\*)$"  # name, or its start and *
)
# KubeRay's own install (its kustomize default and Helm chart) runs the operator as this account.
KUBERAY_OPERATOR_USER = "system:serviceaccount:ray-system:kuberay-operator"
_GROUPS = frozenset({"system:authenticated", "system:unauthenticated", "system:masters"})


class CapacityRevokedAction(StrEnum):
    REQUEUE = "Requeue"  # suspend the job again and ask for capacity anew
    REPORT = "Report"  # keep running; record an Event and the reason


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class RetryPolicy(_Strict):
    """Backoff between ProvisioningRequest attempts: min(base * 2**(attempt-1), max) seconds."""

    limit: int = Field(3, ge=0, le=100, description="New attempts after the first fails; then state Failed.")
    base_seconds: float = Field(10.0, gt=0, description="Delay before the first retry.")
    max_seconds: float = Field(600.0, gt=0, description="Upper bound of the delay.")

    def delay(self, attempt: int) -> float:
        return float(min(self.base_seconds * 2 ** max(attempt - 1, 0), self.max_seconds))


class ProvisioningPolicy(_Strict):
    enabled: bool | None = Field(
        None,
        description="Create ProvisioningRequests for GPU pod sets. Default: on in provisioning and native mode "
        "(off there for static GPU pools), off in volcano mode; never in kueue mode (use Kueue's "
        "ProvisioningRequest admission check there).",
    )
    class_name: str = Field(keys.CHECK_CAPACITY_CLASS, min_length=1, description="provisioningClassName.")
    scale_up_class_name: str = Field(
        keys.BEST_EFFORT_ATOMIC_CLASS, min_length=1,
        description="provisioningClassName of the requests that book a scale-up of an admitted object (pods the "
        "Ray autoscaler, or anyone, added beyond the admitted gang): best-effort-atomic adds their nodes together.",
    )
    parameters: dict[str, str] = Field(
        default_factory=dict, description="spec.parameters (values at most 255 characters)."
    )
    provisioned_timeout_seconds: float = Field(
        1800.0, gt=0, description="A request still not Provisioned this long after the cluster-autoscaler first "
        "answered it not Provisioned is withdrawn and the job asks again with a new one (in its queue: it is never "
        "failed for waiting); one the autoscaler has not answered yet waits."
    )
    capacity_revoked: CapacityRevokedAction = Field(
        CapacityRevokedAction.REPORT, description="What to do when CapacityRevoked turns True after admission."
    )

    @field_validator("parameters")
    @classmethod
    def _short_values(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if len(value) > keys.PROVREQ_MAX_PARAM_LEN:
                raise ValueError(f"parameter {name!r} is longer than {keys.PROVREQ_MAX_PARAM_LEN} characters")
        return v


class Limits(_Strict):
    """What one Ray object may ask of the shared cluster; beyond it the object is refused, at create and on
    update, with the numbers, and nothing is sent to the cluster-autoscaler."""

    max_pods: int = Field(
        4096, ge=1, le=1_000_000,
        description="Most pods one RayJob or RayCluster may ever run: every group at its most (maxReplicas x "
        "numOfHosts under autoscaling, else replicas x numOfHosts), the head and a submitter included.",
    )
    max_request_pods: int = Field(
        1024, ge=1, le=1_000_000,
        description="Most pods one ProvisioningRequest may book (the cluster-autoscaler simulates each of them).",
    )
    max_pending_scale_ups: int = Field(
        3, ge=1, le=100,
        description="Most scale-up requests of one admitted object that may wait for the cluster-autoscaler at "
        "once (not yet Provisioned); its further new pods wait gated, with this reason, until one is answered.",
    )


class QueuePolicy(_Strict):
    """One queue held jobs wait in, in order: priority, then creation time (raygate.core.queueing)."""

    strategy: keys.QueueStrategy = Field(
        keys.QueueStrategy.BEST_EFFORT_FIFO,
        description="StrictFIFO: only the job at the front asks the cluster-autoscaler for capacity; nobody passes "
        "it. BestEffortFIFO: once the front job is answered \"not now\", the next jobs may try one at a time (not "
        "one that asks at least as much of the same nodes), and when capacity frees the front asks first again.",
    )
    lookahead: int = Field(
        8, ge=0, le=1000,
        description="BestEffortFIFO: most jobs behind the front that may have a request out at once.",
    )
    never_fits: keys.NeverFits = Field(
        keys.NeverFits.HOLD,
        description="A job no node group can ever fit (the cluster-autoscaler says so of its pods): Hold keeps it "
        "held with that reason, out of the queue's way; Fail marks it Failed.",
    )
    preemption: keys.Preemption = Field(
        keys.Preemption.NEVER,
        description="LowerPriority: when the job at the front is answered \"not now\", raygate suspends the fewest "
        "running jobs of this queue with a strictly lower priority whose bookings cover its gang (lowest priority "
        "first, then the most recently admitted); they wait in the queue again. Never: nobody is suspended.",
    )
    min_run_seconds: int = Field(
        300, ge=0, le=7 * 24 * 3600,
        description="LowerPriority: a job admitted less than this long ago is not preempted (0: any time).",
    )


def _default_queues() -> dict[str, QueuePolicy]:
    return {keys.DEFAULT_QUEUE: QueuePolicy()}


class NamespacePolicy(_Strict):
    """What raygate does in one namespace."""

    mode: Mode = Field(
        Mode.PROVISIONING,
        description="provisioning: hold each job until its capacity is provisioned; volcano: also gang-schedule "
        "its pods through a Volcano PodGroup; native: also gang-schedule them through Kubernetes' own Workload "
        "and PodGroup (kube-scheduler, Kubernetes 1.36 with its gang-scheduling feature gates); kueue: label and "
        "validate only, Kueue admits.",
    )
    queue_name: str | None = Field(None, description="Kueue LocalQueue or Volcano Queue for jobs here.")
    priority_class: str | None = Field(None, description="Kueue WorkloadPriorityClass or Volcano priority class "
                                       "(in volcano mode, one of allowedPriorityClassNames when that is set).")
    allow_user_queue: bool = Field(False, description="Keep a queue or priority label the user set.")
    managed_resources: list[str] = Field(
        default_factory=lambda: list(DEFAULT_MANAGED_RESOURCES),
        min_length=1,
        description="Pod sets requesting any of these go into the ProvisioningRequest; a trailing * matches "
        "every resource that starts with the rest (nvidia.com/mig-* is every MIG slice profile).",
    )
    managed_device_classes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_MANAGED_DEVICE_CLASSES),
        description="DRA DeviceClasses whose devices count as managed when a pod claims them (resourceClaims).",
    )
    limits: Limits = Field(default_factory=Limits)
    provisioning: ProvisioningPolicy = Field(default_factory=ProvisioningPolicy)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    max_gang: dict[str, str] | None = Field(
        None, description="Largest gang allowed, per resource (e.g. nvidia.com/gpu: \"64\"); larger is refused."
    )
    queue: str = Field(
        keys.DEFAULT_QUEUE, min_length=1,
        description="The queue (in `queues`) this namespace's held jobs wait in where raygate books capacity. Not "
        "Kueue's or Volcano's queue (that is queueName).",
    )
    default_priority_class_name: str | None = Field(
        None, description="PriorityClass of a job that names none (label ray.io/priority-class-name, or a pod "
        "template's priorityClassName, the head's first): its place in the queue. Unset: the cluster's global "
        "default, else 0.",
    )
    allowed_priority_class_names: list[str] | None = Field(
        None, description="The PriorityClasses a Ray object here may name (label ray.io/priority-class-name, pod "
        "templates' priorityClassName); another is refused. A job's priority is its place in its queue, and "
        "with preemption it suspends lower ones: list the classes each team may use. Unset: any, as Kubernetes "
        "allows by itself.",
    )
    fix_shutdown_after_job_finishes: bool = Field(
        False, description="Set shutdownAfterJobFinishes: true on RayJobs instead of refusing them (with a warning)."
    )

    @field_validator("managed_resources")
    @classmethod
    def _resource_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _RESOURCE_PATTERN.match(name) or name == "*":
                raise ValueError(f"{name!r} is not a resource name, or a prefix of one ending in a single *: "
                                 "write e.g. nvidia.com/gpu or nvidia.com/mig-*")
        return v

    @model_validator(mode="after")
    def _default_is_allowed(self) -> NamespacePolicy:
        if (problem := self.unallowed_priority_class("defaultPriorityClassName", self.default_priority_class_name)):
            raise ValueError(problem)
        return self

    def unallowed_priority_class(self, field: str, name: str | None) -> str | None:
        """A PriorityClass the admin names in `field` that allowedPriorityClassNames leaves out."""
        allowed = self.allowed_priority_class_names
        if allowed is None or name is None or name in allowed:
            return None
        return f"{field} {name!r} is not in allowedPriorityClassNames {allowed}: add it there, or name one of those"

    @field_validator("max_gang")
    @classmethod
    def _quantities(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for name, q in (v or {}).items():
            try:
                quantity.parse(q)
            except quantity.QuantityError as err:
                raise ValueError(f"{name}: {err}") from None
        return v

    def for_mode(self, mode: Mode) -> NamespacePolicy:
        """This policy as it applies to an object held under `mode`: a held job finishes under the mode it
        was held with, so a namespace that changes mode strands none. Provisioning falls back to that
        mode's default, so a namespace moved to kueue never admits a held job without its request."""
        if mode is self.mode:
            return self
        return self.model_copy(update={"mode": mode, "provisioning": self.provisioning.model_copy(
            update={"enabled": None})})

    @cached_property
    def _managed(self) -> tuple[frozenset[str], tuple[str, ...], frozenset[str]]:
        exact = frozenset(r for r in self.managed_resources if not r.endswith("*"))
        prefixes = tuple(r[:-1] for r in self.managed_resources if r.endswith("*"))
        return exact, prefixes, frozenset(self.managed_device_classes)

    def manages(self, resource: str) -> bool:
        """Whether a resource is one raygate books: a managedResources name or prefix, or the devices of a
        managed DeviceClass (resource.k8s.io/<class>, as raygate counts DRA claims)."""
        exact, prefixes, classes = self._managed
        if resource.startswith(keys.DRA_RESOURCE_PREFIX):
            return resource[len(keys.DRA_RESOURCE_PREFIX):] in classes
        return resource in exact or resource.startswith(prefixes)

    def managed_names(self) -> str:
        """The managed resources and device classes, as messages name them."""
        return ", ".join([*self.managed_resources, *(f"DeviceClass {c}" for c in self.managed_device_classes)])

    def max_gang_quantities(self) -> quantity.Resources:
        return {k: quantity.parse(v) for k, v in (self.max_gang or {}).items()}


class SelectorRequirement(_Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        match self.operator:
            case "In":
                return present and labels[self.key] in self.values
            case "NotIn":
                return not present or labels[self.key] not in self.values
            case "Exists":
                return present
            case _:
                return not present


class LabelSelector(_Strict):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[SelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


def _default_selector() -> LabelSelector:
    return LabelSelector(match_labels={keys.OPT_IN_LABEL: keys.OPT_IN_VALUE})


class RaygateConfig(_Strict):
    """The whole of `config.yaml`."""

    namespace_selector: LabelSelector = Field(
        default_factory=_default_selector,
        description="Namespaces raygate acts in; kube-system and raygate-system are always excluded.",
    )
    trusted_users: list[str] = Field(
        default_factory=lambda: [
            f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"
        ],
        description="Users allowed to change a held job's suspend flag and raygate's labels.",
    )
    ray_operator_users: list[str] = Field(
        default_factory=lambda: [KUBERAY_OPERATOR_USER],
        description="Usernames of the KubeRay operator. A RayCluster is taken as a RayJob's own cluster, and "
        "left alone, only when one of these creates it for a RayJob raygate admitted; only their pods may claim a "
        "Ray object, and on Kubernetes 1.36+ the pod gate's policy gates their GPU pods inside the API server.",
    )
    failure_policy: Literal["Fail", "Ignore"] = Field(
        "Fail", description="Webhook failurePolicy written into the webhook configurations."
    )
    queues: dict[str, QueuePolicy] = Field(
        default_factory=_default_queues,
        description="The queues held jobs wait in, by name; each namespace's `queue` names one. One, `default`, "
        "unless you define others (for separate node pools or teams).",
    )
    defaults: NamespacePolicy = Field(default_factory=NamespacePolicy)
    namespaces: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per-namespace overrides of any `defaults` field."
    )

    @field_validator("trusted_users", "ray_operator_users")
    @classmethod
    def _users_not_groups(cls, v: list[str]) -> list[str]:
        for user in v:
            if not user or user != user.strip() or "*" in user:
                raise ValueError(f"{user!r} is not a username: give the exact name the API server authenticates, "
                                 "such as system:serviceaccount:<namespace>:<name>")
            if user.startswith("system:serviceaccounts") or user in _GROUPS:
                raise ValueError(f"{user!r} is a group, not a user: name one ServiceAccount as "
                                 "system:serviceaccount:<namespace>:<name>")
            if user.startswith("system:serviceaccount:") and len(user.split(":")) != 4:
                raise ValueError(f"{user!r} is not a ServiceAccount username: the form is "
                                 "system:serviceaccount:<namespace>:<name>")
        return v

    @field_validator("namespace_selector")
    @classmethod
    def _never_kube_system(cls, v: LabelSelector) -> LabelSelector:
        for ns in sorted(PROTECTED_NAMESPACES):
            if v.matches({"kubernetes.io/metadata.name": ns}):
                raise ValueError(
                    f"this selector matches {ns}; select opted-in namespaces by a label such as "
                    f"{keys.OPT_IN_LABEL}: {keys.OPT_IN_VALUE}"
                )
        return v

    @cached_property
    def _policies(self) -> dict[str, NamespacePolicy]:
        # Merged once per config object (configs are immutable; a reload builds a new one).
        return {ns: merge_override(self.defaults, o) for ns, o in self.namespaces.items()}

    def policy_for(self, namespace: str) -> NamespacePolicy:
        return self._policies.get(namespace, self.defaults)

    def opted_in(self, namespace: str, labels: dict[str, str] | None) -> bool:
        """The in-code check behind the webhook's namespaceSelector (in case that is misconfigured).

        `labels` is None when the namespace cache has not seen the namespace yet; the API server
        only calls us for namespaces its selector matched, so a just-created namespace counts.
        """
        if namespace in PROTECTED_NAMESPACES:
            return False
        if labels is None:
            return True
        return self.namespace_selector.matches({"kubernetes.io/metadata.name": namespace, **labels})


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def merge_override(defaults: NamespacePolicy, override: dict[str, Any]) -> NamespacePolicy:
    base = defaults.model_dump(by_alias=True, exclude_none=True)
    return NamespacePolicy.model_validate(_deep_merge(base, override), by_alias=True, by_name=False)


class ConfigError(ValueError):
    """An invalid config, with one `path: message` line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def field_problems(err: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[str]:
    """One `path: message` line per error of a model's validation, under `prefix`."""
    out = []
    for e in err.errors():
        path = ".".join(str(p) for p in (*prefix, *e["loc"])) or "(root)"
        msg = e["msg"].removeprefix("Value error, ")
        out.append(f"{path}: {msg}")
    return out


def parse_fields(text: str) -> RaygateConfig:
    """`config.yaml` parsed into the models, every field checked; raises ConfigError naming each bad one.
    (raygate.core.config.parse_config also checks each namespace's policy against its mode and the cluster.)"""
    try:
        raw = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise ConfigError([f"config.yaml is not valid YAML: {err}".replace("\n", " ")]) from None
    if not isinstance(raw, dict):
        raise ConfigError(["config.yaml must be a mapping with keys such as defaults and namespaces"])
    try:
        # camelCase only: a snake_case key is an unknown key, not a silent synonym.
        return RaygateConfig.model_validate(raw, by_alias=True, by_name=False)
    except ValidationError as err:
        raise ConfigError(field_problems(err)) from None


DEFAULT_CONFIG = RaygateConfig()
