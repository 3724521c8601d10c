"""volcano mode: hold the job, route every pod to Volcano in one PodGroup, record the PodGroup spec.

The webhook records the spec in an annotation (`apply`); the reconciler reads it back (`recorded`)
and creates the PodGroup from it (`group_object`), once the group's Volcano queue is Open. Pods
find it through the group-name annotation on every pod template, the submitter's included, so the
whole gang schedules together.

With `metadata.generateName` the name (and so the PodGroup's, `ray-<name>-pg`) is chosen by the API
server after this webhook has answered. Everything else is written here; the group-name annotation
is written by the reconciler in the patch that unsuspends the job (`admit`), so no pod is ever
created without it (and the guard keeps anyone else from unsuspending the job or writing it).

The PodGroup carries the name KubeRay's own Volcano integration uses, so the two never make two
groups for one job. They cannot share one either: with the operator flag `--batch-scheduler=volcano`
KubeRay updates any PodGroup of that name to its own minMember and minResources once the job runs
(v1.6 leaves init containers, pod overhead and its autoscaler sidecar out of minResources; v1.7 also
resets the group when a job is suspended), so Volcano would no longer schedule the gang raygate
admitted. raygate does not fight over the object: `drift` finds the rewrite, and the reconciler stops
the job with the reason (`rewritten`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from raygate.core import api, keys, queue_labels
from raygate.core import quantity as q
from raygate.core.api import Resource, Served
from raygate.core.keys import ChildKind, Mode
from raygate.core.modes.base import GroupSpec, GroupsWithDrift, GroupsWithPrerequisite, ModeRules, Prerequisite
from raygate.core.modes.provisioning import hold
from raygate.core.objects import JSON, get
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, ManifestError, Workload, child_metadata

DEFAULT_QUEUE = "default"  # Volcano's built-in queue
OPEN = "Open"


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


def _resources(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    try:
        return {str(k): q.parse(v) for k, v in value.items()}
    except q.QuantityError:
        return None


class Volcano(ModeRules, GroupsWithPrerequisite, GroupsWithDrift):
    mode = Mode.VOLCANO
    decided_labels = frozenset({keys.VOLCANO_QUEUE_LABEL, keys.RAY_PRIORITY_CLASS_LABEL})
    template_annotations = (keys.VOLCANO_GROUP_NAME_ANNOTATION, keys.VOLCANO_TASK_SPEC_ANNOTATION)
    group_kinds = (ChildKind.POD_GROUP,)
    prerequisite_reason = "QueueNotOpen"
    rewritten_reason = "PodGroupRewritten"

    def config_problems(self, policy: NamespacePolicy) -> list[str]:
        # priorityClass goes into every job's PriorityClass label, the one allowedPriorityClassNames bounds.
        problem = policy.unallowed_priority_class("priorityClass", policy.priority_class)
        return [problem] if problem else []

    # --- at creation (webhook) ------------------------------------------------------------------
    def apply(self, b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
        hold(b)
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

    def held_changes(self, old: Workload, new: Workload) -> list[str]:
        # Its PodGroup spec and every template's Volcano metadata were fixed at creation.
        return ["change its pod sets in volcano mode"] if old.gang() != new.gang() else []

    # --- the PodGroup (reconciler) ----------------------------------------------------------------
    def recorded(self, w: Workload) -> GroupSpec:
        text = w.annotations.get(keys.POD_GROUP_ANNOTATION)
        if text is None:
            raise ManifestError(f"volcano mode needs the PodGroup spec in annotation {keys.POD_GROUP_ANNOTATION}, "
                                "which the webhook writes at creation: re-create the job")
        try:
            spec = json.loads(text)
        except (TypeError, ValueError) as err:
            raise ManifestError(f"annotation {keys.POD_GROUP_ANNOTATION} is not valid JSON ({err}): re-create the "
                                "job") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("minMember"), int):
            raise ManifestError(f"annotation {keys.POD_GROUP_ANNOTATION} is not a PodGroup spec with an integer "
                                "minMember: re-create the job")
        queue = spec.get("queue")
        if not isinstance(queue, str) or not queue:
            raise ManifestError(f"annotation {keys.POD_GROUP_ANNOTATION} names no queue: re-create the job")
        return GroupSpec(w.pod_group_name, spec)

    def resources(self, served: Served) -> dict[ChildKind, Resource]:
        return {ChildKind.POD_GROUP: api.PODGROUPS} if served.serves(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION) else {}

    def group_objects(self, w: Workload, spec: GroupSpec, served: Served) -> list[tuple[ChildKind, JSON]]:
        return [(ChildKind.POD_GROUP, {"apiVersion": api.PODGROUPS.api_version, "kind": api.PODGROUPS.kind,
                                       "metadata": child_metadata(w, spec.name), "spec": spec.spec})]

    def prerequisite(self, spec: GroupSpec) -> Prerequisite:
        # Volcano rejects a PodGroup whose queue is missing or not Open: look first.
        return Prerequisite(api.VOLCANO_QUEUES, str(spec.spec["queue"]))

    def prerequisite_problem(self, spec: GroupSpec, found: Mapping[str, Any] | None) -> str | None:
        name = spec.spec["queue"]
        if found is None:
            return f"Volcano queue {name} does not exist; create it or set queueName in raygate-config"
        state = str(get(found, ("status", "state")) or "")
        return None if state == OPEN else f"Volcano queue {name} is {state or 'not reported by Volcano'}, not {OPEN}"

    def drift(self, spec: GroupSpec, actual: Mapping[str, Any]) -> list[str]:
        """Quantities compared by value: another writer may spell them otherwise."""
        recorded, have = spec.spec, get(actual, ("spec",)) or {}
        out = []
        for key in ("minMember", "queue"):
            if recorded.get(key) != have.get(key):
                out.append(f"{key} {recorded.get(key)} -> {have.get(key)}")
        if (recorded.get("minTaskMember") or {}) != (have.get("minTaskMember") or {}):
            out.append(f"minTaskMember {recorded.get('minTaskMember') or {}} -> {have.get('minTaskMember') or {}}")
        if _resources(recorded.get("minResources")) != _resources(have.get("minResources")):
            out.append(f"minResources {dict(recorded.get('minResources') or {})} -> {have.get('minResources')}")
        return out

    def rewritten(self, spec: GroupSpec, changes: list[str]) -> str:
        return (f"PodGroup {spec.name} was rewritten by another writer ({'; '.join(changes)}). KubeRay's own "
                "Volcano integration (operator flag --batch-scheduler=volcano) updates every PodGroup named "
                "ray-<name>-pg to its own counts, so Volcano would no longer schedule the gang raygate admitted; "
                "raygate suspended the job. Where raygate's volcano mode is used, run the KubeRay operator "
                "without --batch-scheduler (raygate creates the PodGroup), or use provisioning mode")

    def schedules(self, spec: GroupSpec) -> str:
        return f"PodGroup {spec.name} in Volcano queue {spec.spec['queue']} gang-schedules the pods"

    def admit(self, b: PatchBuilder, w: Workload, spec: GroupSpec) -> None:
        # Written here rather than by the webhook for a job created with generateName (its name, and so
        # its PodGroup's, did not exist yet); for any other job it is already in place and adds nothing.
        for _, path in w.template_paths():
            b.set((*path, "metadata", "annotations", keys.VOLCANO_GROUP_NAME_ANNOTATION), spec.name)


RULES = Volcano()
