"""volcano mode: hold the job, route every pod to Volcano in one PodGroup, record the PodGroup spec.

The webhook records the spec in an annotation (`apply`); the reconciler reads it back (`pod_group`)
and creates the PodGroup from it. Pods find it through the group-name annotation on every pod
template, the submitter's included, so the whole gang schedules together.

With `metadata.generateName` the name (and so the PodGroup's, `ray-<name>-pg`) is chosen by the API
server after this webhook has answered. Everything else is written here; the group-name annotation
is written by the reconciler in the patch that unsuspends the job, so no pod is ever created
without it (and the guard keeps anyone else from unsuspending the job or writing the annotation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from raygate.core import keys, queue_labels
from raygate.core import quantity as q
from raygate.core.modes import provisioning
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import JSON, Gang, ManifestError, Workload, get

DEFAULT_QUEUE = "default"  # Volcano's built-in queue
HOLDS = True


@dataclass(frozen=True)
class PodGroupSpec:
    """The PodGroup a held job gets, as the webhook recorded it."""

    name: str
    queue: str
    spec: JSON


def refusals(w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
    return provisioning.refusals(w, policy, gang)


def pod_group_spec(w: Workload, policy: NamespacePolicy, gang: Gang, queue_name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "minMember": gang.min_member,
        "minTaskMember": gang.min_task_member,
        "minResources": q.render(gang.min_resources),
        "queue": queue_name,
    }
    priority = queue_labels.chosen(w, policy, keys.RAY_PRIORITY_CLASS_LABEL, policy.priority_class)
    if priority:
        spec["priorityClassName"] = priority
    return spec


def default_submitter_template(w: Workload) -> dict[str, Any]:
    """KubeRay's default submitter pod, written out so it can carry the Volcano metadata.

    KubeRay fills in the `ray job submit` command and its environment when the command is empty.
    """
    head_image = get(w.cluster_spec, ("headGroupSpec", "template", "spec", "containers", 0, "image"))
    container: dict[str, Any] = {
        "name": "ray-job-submitter",
        "resources": {
            "requests": dict(keys.SUBMITTER_DEFAULT_REQUESTS),
            "limits": dict(keys.SUBMITTER_DEFAULT_LIMITS),
        },
    }
    if isinstance(head_image, str):  # the API server's schema refuses anything else: never copy junk
        container["image"] = head_image
    return {"spec": {"restartPolicy": "Never", "containers": [container]}}


def apply(b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
    provisioning.apply(b, w, policy, gang)
    queue_name = queue_labels.apply_labels(
        b, w, policy, queue_label=keys.VOLCANO_QUEUE_LABEL, priority_label=keys.RAY_PRIORITY_CLASS_LABEL,
        default_queue=DEFAULT_QUEUE,
    ) or DEFAULT_QUEUE
    templates = w.template_paths()
    if w.is_job and w.submission_mode == "K8sJobMode" and not get(w.obj, ("spec", "submitterPodTemplate")):
        b.set(("spec", "submitterPodTemplate"), default_submitter_template(w))
        templates.append((keys.SUBMITTER_TASK, ("spec", "submitterPodTemplate")))
    # With generateName the name is picked after the mutating webhooks (the validating ones see it): the
    # same rule on both sides, so a stored object validates as it was mutated.
    named = not get(w.obj, ("metadata", "generateName"))
    for task, path in templates:
        b.set((*path, "spec", "schedulerName"), keys.VOLCANO_SCHEDULER)
        group_name = (*path, "metadata", "annotations", keys.VOLCANO_GROUP_NAME_ANNOTATION)
        if named:
            b.set(group_name, w.pod_group_name)
        else:  # generateName: the reconciler names the group when it unsuspends; nobody else may
            b.remove(group_name)
        b.set((*path, "metadata", "annotations", keys.VOLCANO_TASK_SPEC_ANNOTATION), task)
    spec = pod_group_spec(w, policy, gang, queue_name)
    b.set(("metadata", "annotations", keys.POD_GROUP_ANNOTATION), json.dumps(spec, sort_keys=True))


def pod_group(w: Workload) -> PodGroupSpec | None:
    """The PodGroup spec `apply` recorded; raises ManifestError when it is missing or unusable."""
    text = w.annotations.get(keys.POD_GROUP_ANNOTATION)
    if text is None:
        raise ManifestError(f"volcano mode needs the PodGroup spec in annotation {keys.POD_GROUP_ANNOTATION}, "
                            "which the webhook writes at creation: re-create the job")
    try:
        spec = json.loads(text)
    except (TypeError, ValueError) as err:
        raise ManifestError(f"annotation {keys.POD_GROUP_ANNOTATION} is not valid JSON ({err}): re-create the job") \
            from None
    if not isinstance(spec, dict) or not isinstance(spec.get("minMember"), int):
        raise ManifestError(f"annotation {keys.POD_GROUP_ANNOTATION} is not a PodGroup spec with an integer "
                            "minMember: re-create the job")
    queue = spec.get("queue")
    if not isinstance(queue, str) or not queue:
        raise ManifestError(f"annotation {keys.POD_GROUP_ANNOTATION} names no queue: re-create the job")
    return PodGroupSpec(w.pod_group_name, queue, spec)
