"""Pure builders of the objects the reconciler creates for a job: PodTemplates and the
ProvisioningRequest, with deterministic names and owner references (a mode's group object is the
mode's own: raygate.core.modes).

Deterministic names are what makes the reconciler crash-safe: a restarted reconciler computes the
same name, its create answers AlreadyExists, and nothing is ever created twice.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from raygate.core import identity, keys, podgate
from raygate.core import quantity as q
from raygate.core.keys import ChildKind
from raygate.core.names import MAX_NAME, digest, dns, short_hash
from raygate.core.objects import JSON, Key, controller_ref, get, meta_str
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Manages, PodSet, Workload, child_metadata


class BadInput(ValueError):
    """The job cannot be gang-admitted as written; the message says what to change."""


def _job_hash(w: Workload) -> str:
    return short_hash(w.kind, w.namespace, w.name, str(get(w.obj, ("metadata", "uid"), "")))


def request_name(w: Workload, attempt: int, pod_sets: str, rounds: int = 0) -> str:
    """`<job>-<hash>-a<attempt>[r<round>]`: a new name for every attempt, for every change of the pod sets
    it books (`pod_sets` is their fingerprint), so a request never outlives the spec it was made for, and
    for every time its queue withdrew it or had it ask again (`rounds`), so the autoscaler sees a new request."""
    suffix = f"-{short_hash(_job_hash(w), pod_sets)}-a{attempt}" + (f"r{rounds}" if rounds else "")
    return dns(w.name, MAX_NAME - len(suffix)) + suffix


def template_name(w: Workload, pod_set: PodSet) -> str:
    """`<job>-<pod set>-<hash>`: one per pod set and placement, shared by all attempts. The hash covers
    the pod set name, so two groups whose names shorten to the same text still differ, and what decides
    where its pods fit, so such an edit while the job is held makes a new one."""
    h = short_hash(w.kind, w.namespace, w.name, str(get(w.obj, ("metadata", "uid"), "")), pod_set.name,
                   digest(placement(w, pod_set)))
    set_part = dns(pod_set.name, 24)
    job_part = dns(w.name, MAX_NAME - len(h) - len(set_part) - 2)
    return f"{job_part}-{set_part}-{h}"


def placement(w: Workload, pod_set: PodSet) -> JSON:
    """What the capacity booked for a pod set depends on: each pod's effective request (quantities in
    canonical form) and the fields that choose its nodes. An image or a command can change freely."""
    spec = get(w.obj, (*pod_set.template_path, "spec")) if pod_set.template_path is not None else None
    return {"resources": q.render(pod_set.per_pod), **podgate.fields_view(spec, podgate.PLACEMENT_FIELDS)}


def fingerprint(w: Workload, pod_sets: Sequence[PodSet]) -> str:
    """What a request books: each pod set's name, pod count and placement. The request records it
    (annotation raygate.io/pod-sets) and admission compares it with the job as it is then."""
    return short_hash(*(f"{p.name}={p.count}={template_name(w, p)}" for p in pod_sets), length=16)


def event_name(w: Workload, reason: str, detail: str = "") -> str:
    """A deterministic Event name, so a replayed step after a crash records no second Event."""
    return f"{dns(w.name, 200)}.{short_hash(w.kind, w.name, reason, detail, length=10)}"


def owner_of(obj: Mapping[str, Any]) -> identity.RayOwner | None:
    """The job a child was made for: its controller reference, or raygate's record of it once the garbage
    collector has stripped that (`kubectl delete --cascade=orphan`): an orphaned child is still raygate's
    to delete, when no pod consumes its booking any more."""
    ref = identity.ray_ref(controller_ref(obj))
    return ref if ref is not None else identity.RayOwner.parse(identity.recorded(obj))


def made_for(child: Mapping[str, Any]) -> str | None:
    """The uid of the job a child was made for (a child of an earlier job of the same name is not this one's)."""
    owner = owner_of(child)
    return owner.uid if owner is not None else None


def controller_key(obj: Mapping[str, Any]) -> Key | None:
    """The RayJob or RayCluster a child was made for."""
    owner = owner_of(obj)
    return Key(owner.kind, meta_str(obj, "namespace"), owner.name) if owner is not None else None


# --- PodTemplates and the ProvisioningRequest --------------------------------------------------

def _template_of(w: Workload, pod_set: PodSet) -> JSON:
    if pod_set.template_path is None:
        raise BadInput(f"pod set {pod_set.name} has no pod template to copy")
    return template_copy(get(w.obj, pod_set.template_path) or {})


def template_copy(found: Mapping[str, Any]) -> JSON:
    """A pod template copied for capacity checking."""
    template = copy.deepcopy(dict(found))
    # A copy for capacity checking: it must not claim a booking itself, nor carry the gate of the pods it stands for.
    annotations = get(template, ("metadata", "annotations"))
    for key in podgate.BOOKING_ANNOTATIONS:
        if isinstance(annotations, dict):
            annotations.pop(key, None)
    return podgate.without_stamp(template)


def pod_template(w: Workload, pod_set: PodSet, manages: Manages) -> JSON:
    """The PodTemplate a request's pod set refers to, recording the pod set and what pods it covers."""
    template = _template_of(w, pod_set)
    return templated(child_metadata(w, template_name(w, pod_set)), pod_set.name, template,
                     pod_set.managed(manages))


def templated(meta: JSON, pod_set: str, template: JSON, managed: q.Resources) -> JSON:
    meta["annotations"] |= {keys.POD_SET_ANNOTATION: pod_set,
                           keys.PLACEMENT_ANNOTATION: podgate.match_digest(template.get("spec"), managed)}
    return {"metadata": meta, "template": template}


def parameters(w: Workload, policy: NamespacePolicy) -> dict[str, str]:
    """The config's parameters, overridden per job by annotations provreq.raygate.io/<Parameter>."""
    out = dict(policy.provisioning.parameters)
    for key, value in w.annotations.items():
        if key.startswith(keys.PROVREQ_PARAM_PREFIX):
            name = key[len(keys.PROVREQ_PARAM_PREFIX):]
            if not name:
                raise BadInput(f"annotation {key} names no parameter: use {keys.PROVREQ_PARAM_PREFIX}<Parameter>")
            if len(str(value)) > keys.PROVREQ_MAX_PARAM_LEN:
                raise BadInput(
                    f"annotation {key} is longer than {keys.PROVREQ_MAX_PARAM_LEN} characters, the limit of a "
                    "ProvisioningRequest parameter: shorten it"
                )
            out[name] = str(value)
    return out


def provisioning_request(w: Workload, pod_sets: list[PodSet], policy: NamespacePolicy, attempt: int,
                         api_version: str, pod_sets_fingerprint: str, rounds: int = 0) -> JSON:
    if not pod_sets:
        raise BadInput("no pod set requests a managed resource, so there is nothing to provision")
    spec: JSON = {
        "provisioningClassName": policy.provisioning.class_name,
        "podSets": [{"podTemplateRef": {"name": template_name(w, p)}, "count": p.count} for p in pod_sets],
    }
    params = parameters(w, policy)
    if params:
        spec["parameters"] = params
    meta = child_metadata(w, request_name(w, attempt, pod_sets_fingerprint, rounds))
    meta["annotations"] |= {keys.POD_SETS_ANNOTATION: pod_sets_fingerprint}
    return {"apiVersion": f"{keys.PROVREQ_GROUP}/{api_version}", "kind": ChildKind.PROVISIONING_REQUEST.value,
            "metadata": meta, "spec": spec}


# --- scale-ups: pods beyond the admitted gang, booked as gangs of their own ------------------------

def scale_up_template(w: Workload, pod_set: str, digest: str, template: JSON, managed: q.Resources) -> JSON:
    """The PodTemplate of a scale-up, from the spec the pods are made from (or from a gated pod no spec
    explains); one per pod set and placement, shared by every scale-up of the same shape."""
    name_hash = short_hash(_job_hash(w), pod_set, digest)
    set_part = dns(pod_set, 24)
    name = f"{dns(w.name, MAX_NAME - len(name_hash) - len(set_part) - 4)}-{set_part}-{name_hash}-s"
    return templated(child_metadata(w, name), pod_set, template, managed)


def scale_up_request(w: Workload, pod_set: str, template: str, count: int, existing: Sequence[str],
                     policy: NamespacePolicy, api_version: str) -> JSON:
    """A request for `count` more pods of `pod_set`. Named after what the reconciler saw when it asked
    (the requests the object had, and the count), so a replay after a crash finds the same name."""
    suffix = f"-{short_hash(_job_hash(w), pod_set, template, str(count), *sorted(existing))}-s"
    meta = child_metadata(w, dns(w.name, MAX_NAME - len(suffix)) + suffix)
    meta["annotations"] |= {keys.SCALE_UP_ANNOTATION: pod_set}
    spec: JSON = {"provisioningClassName": policy.provisioning.scale_up_class_name,
                  "podSets": [{"podTemplateRef": {"name": template}, "count": count}]}
    if params := parameters(w, policy):
        spec["parameters"] = params
    return {"apiVersion": f"{keys.PROVREQ_GROUP}/{api_version}", "kind": ChildKind.PROVISIONING_REQUEST.value,
            "metadata": meta, "spec": spec}
