"""Whose a pod is: the Ray object whose booking it may use, decided once, when it is created.

raygate never reads a pod's Ray identity from fields that may change after creation: the garbage
collector strips owner references (`kubectl delete --cascade=orphan`), and a user with Kubernetes'
built-in `edit` role may rewrite a pod's labels, annotations and owner references. The pod webhook
records the identity at CREATE, from what the API server tells it then: who asks (userInfo) and the
pod's controller reference. Only KubeRay's operator makes a Ray object's pods; only the Job controller
makes a batch Job's pods, and a batch Job's Ray owner is recorded in its pod template when KubeRay's
operator creates the Job (so the Job controller copies it into every pod). Anything else is a pod of
no Ray object. The record is raygate's: the validating webhook refuses anyone else's edit of it.

A child object raygate creates (PodTemplate, ProvisioningRequest, PodGroup) carries the same record of
its job, so that it is still raygate's to clean up once the garbage collector has stripped its owner.

Pure: objects and usernames in, records out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from raygate.core import keys
from raygate.core.objects import controller_ref, get, labels, meta_str

NO_RAY_OWNER = "none"  # recorded on a pod or a Job template that belongs to no Ray object
RAY_KINDS = (keys.RAYJOB_KIND, keys.RAYCLUSTER_KIND)
# The labels KubeRay puts on the pods it makes, which its own controllers select pods by.
RAY_POD_LABELS = (keys.RAY_NODE_TYPE_LABEL, keys.RAY_CLUSTER_LABEL, keys.RAY_GROUP_LABEL)


@dataclass(frozen=True)
class RayOwner:
    """A Ray object by kind, name and uid; for a pod, also the pod set it was made for."""

    kind: str
    name: str
    uid: str
    pod_set: str = ""

    def render(self) -> str:
        return "/".join((self.kind, self.name, self.uid, self.pod_set)).rstrip("/")

    @classmethod
    def parse(cls, text: object) -> RayOwner | None:
        """The record, or None when `text` is not one (absent, "none", or damaged)."""
        if not isinstance(text, str):
            return None
        parts = text.split("/")
        if len(parts) not in (3, 4) or parts[0] not in RAY_KINDS or not all(parts[1:3]):
            return None
        return cls(*parts) if len(parts) == 4 else cls(parts[0], parts[1], parts[2])

    def same_object(self, obj: Mapping[str, Any]) -> bool:
        return meta_str(obj, "name") == self.name and meta_str(obj, "uid") == self.uid


def pod_set_of(pod: Mapping[str, Any]) -> str:
    """The pod set a pod belongs to: its Ray group (KubeRay's label, which templates cannot override), or
    the submitter for a pod of KubeRay's batch Job."""
    group = get(pod, ("metadata", "labels", keys.RAY_GROUP_LABEL))
    if isinstance(group, str) and group:
        return keys.HEAD_GROUP_TASK if group == "headgroup" else group
    return keys.SUBMITTER_TASK


def system_controller(user: str) -> bool:
    """Kubernetes' own controllers (garbage collector, Job controller, ...): kube-controller-manager under its
    own name, or under one ServiceAccount of kube-system per controller (--use-service-account-credentials)."""
    return user == "system:kube-controller-manager" or user.startswith("system:serviceaccount:kube-system:")


def ray_ref(ref: Mapping[str, Any] | None) -> RayOwner | None:
    if ref is None or ref.get("kind") not in RAY_KINDS or not str(ref.get("apiVersion", "")).startswith(
            keys.RAY_GROUP + "/"):
        return None
    name, uid = str(ref.get("name") or ""), str(ref.get("uid") or "")
    return RayOwner(str(ref["kind"]), name, uid) if name and uid else None


def _batch_job_ref(ref: Mapping[str, Any] | None) -> bool:
    return ref is not None and ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/")


def recorded(obj: Mapping[str, Any]) -> str | None:
    """The identity record on a pod (or a child object), as written; None when it has none."""
    found = get(obj, ("metadata", "annotations", keys.RAY_OWNER_ANNOTATION))
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class PodIdentity:
    """What the pod webhook decides at CREATE: the record to write (None: leave the pod without one, which
    only a pod of a batch Job made before raygate recorded Job owners may be), or a refusal."""

    record: str | None
    refusal: str | None = None


def at_pod_create(pod: Mapping[str, Any], user: str, operators: Collection[str]) -> PodIdentity:
    """The Ray identity of a pod being created by `user` (`operators`: KubeRay's operator usernames)."""
    ref = controller_ref(pod)
    owner = ray_ref(ref)
    if owner is not None and user in operators:
        return PodIdentity(RayOwner(owner.kind, owner.name, owner.uid, pod_set_of(pod)).render())
    if _batch_job_ref(ref) and system_controller(user):
        stamp = recorded(pod)  # copied by the Job controller from the Job's template, stamped at the Job's create
        if stamp is None:
            return PodIdentity(None)  # a Job from before raygate recorded owners: read as it always was
        if RayOwner.parse(stamp) is not None:
            return PodIdentity(stamp)
    claims = [f"a controller reference to {owner.kind} {owner.name}"] if owner is not None else []
    claims += [f"label {k}" for k in RAY_POD_LABELS if k in labels(pod)]
    if claims:
        who = user or "an unknown user"
        return PodIdentity(NO_RAY_OWNER, refusal=(
            f"this pod asks for GPUs and claims to be a Ray object's ({', '.join(claims)}), but {who} is not "
            "KubeRay's operator: only KubeRay makes a Ray cluster's pods, and raygate books GPUs only for them. "
            "Create a RayCluster or RayJob instead, or leave the Ray labels and owner reference out of this pod"))
    return PodIdentity(NO_RAY_OWNER)


def job_template_record(job: Mapping[str, Any], user: str, operators: Collection[str]) -> str:
    """The record stamped into a batch Job's pod template at its CREATE: its Ray owner when KubeRay's operator
    makes it for a Ray object (the RayJob's submitter, a cluster's cleanup Job), else none."""
    owner = ray_ref(controller_ref(job))
    if owner is None or user not in operators:
        return NO_RAY_OWNER
    template = get(job, ("spec", "template"))
    pod_set = pod_set_of(template if isinstance(template, Mapping) else {})
    return RayOwner(owner.kind, owner.name, owner.uid, pod_set).render()


def child_record(kind: str, name: str, uid: str) -> str:
    """The record on a child object raygate creates for a job."""
    return RayOwner(kind, name, uid).render()


def recorded_parent(cluster: Mapping[str, Any]) -> RayOwner | None:
    """The RayJob a RayCluster was made for, as the webhook recorded when KubeRay's operator created it."""
    found = get(cluster, ("metadata", "annotations", keys.PARENT_ANNOTATION))
    owner = RayOwner.parse(found)
    return owner if owner is not None and owner.kind == keys.RAYJOB_KIND else None
