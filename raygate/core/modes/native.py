"""native mode: Kubernetes' own gang scheduling (KEP-4671) on top of the capacity raygate books.

kube-scheduler (1.36, alpha) binds the pods of a PodGroup together or not at all: none of them binds
until `minCount` of them fit. raygate holds each job as in provisioning mode, books its GPU capacity with
a ProvisioningRequest (on by default; off for static GPU pools) and, beside it, creates a Workload (one
PodGroupTemplate, `gang`) and a PodGroup made from it, owned by the job, with `minCount` = the pods
KubeRay starts for the gang (head and workers as raygate counts them; the K8sJobMode submitter waits for
the cluster and is left out). The booking makes sure the nodes are there; the PodGroup makes sure the
gang binds whole even when something else takes part of that room first.

Pods name their group in `spec.schedulingGroup.podGroupName`, which is immutable once the pod exists
and which KubeRay v1.6.2's CRDs prune from pod templates. So the patch that unsuspends the job writes
the group's name as an annotation on every pod template of the gang, and the pod webhook copies it into
each pod at CREATE (`pod_patch`).

Both objects are immutable in v1alpha2: the group is named after its `minCount` and the attempt, so a
held job whose gang changes gets new ones (the reconciler deletes the old), and so does each attempt.
Elastic growth: once kube-scheduler has bound the gang of a Ray cluster (the reconciler records that
cluster on the gang's PodGroup, `marks`), a new GPU pod of that cluster is a scale-up's or a restart's
(gated, booked); the pod webhook names a group of its own for it, one per increment (`increment_name`:
the first whose PodGroup does not exist yet), and the reconciler creates that PodGroup, with minCount =
the pods it releases into it together, before it lifts their gates. Before, every pod joins the gang's
group (and so does every pod of another cluster: a RayJob's retry), so no pod the gang counts on is
ever elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raygate.core import api, keys
from raygate.core.api import Resource, Served
from raygate.core.identity import pod_set_of
from raygate.core.keys import ChildKind, Mode
from raygate.core.modes.base import GroupsAtThePod, GroupSpec, Members, ModeRules
from raygate.core.modes.provisioning import hold
from raygate.core.names import dns, short_hash
from raygate.core.objects import JSON, get
from raygate.core.patch import PatchBuilder, PatchOp
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import DEFAULT_SCHEDULER, Gang, Workload, child_metadata

WORKLOAD_KIND = "Workload"
NAME_BUDGET = 40  # of the job's name in its group's: group names stay within 63 characters, increments too


def min_count(gang: Gang) -> int:
    """The pods KubeRay starts for the gang (what raygate books), the submitter left out: it starts after
    the cluster is up, so counting it would keep the cluster from ever binding."""
    return sum(p.count for p in gang.pod_sets if p.in_min_member)


def attempt(w: Workload) -> int:
    """The attempt a held or admitted job is in, as the reconciler records it (1 before its first request;
    a job relabelled Pending after Failed has no request, and starts over at 1)."""
    try:
        n = int(w.annotations.get(keys.ATTEMPT_ANNOTATION, ""))
    except ValueError:
        return 1
    return n if n >= 1 and w.annotations.get(keys.REQUEST_ANNOTATION) else 1


def group_name(w: Workload, count: int) -> str:
    """`<job>-<hash of the job, minCount and attempt>`: a job whose gang changes while held gets a new group,
    and so does each attempt (a job requeued after admission starts its gang afresh); a job re-created under
    the same name never meets its predecessor's (the uid is in the hash)."""
    uid = str(get(w.obj, ("metadata", "uid"), ""))
    return f"{dns(w.name, NAME_BUDGET)}-{short_hash(w.kind, w.namespace, w.name, uid, str(count), str(attempt(w)))}"


def increment_name(group: str, pod_set: str, n: int) -> str:
    """The group of the n-th scale-up increment of a pod set beyond the gang's own pods."""
    return f"{group}-{short_hash(group, pod_set, length=6)}-{n}"


class Native(ModeRules, GroupsAtThePod):
    mode = Mode.NATIVE
    admitted_by = "raygate"
    provisions_by_default = True
    template_annotations = (keys.GANG_GROUP_ANNOTATION,)
    group_kinds = (ChildKind.WORKLOAD, ChildKind.GANG_POD_GROUP)
    named_at_creation = False  # the templates name a group per admission (attempt), through raygate's pod webhook

    # --- the cluster and the config ---------------------------------------------------------------
    def cluster_problems(self, served: Served) -> list[str]:
        if not served.known or served.gang_version is not None:
            return []
        versions = " nor ".join(f"{keys.GANG_GROUP}/{v}" for v in keys.GANG_VERSIONS)
        return [f"native mode needs Kubernetes' gang scheduling, and this cluster served neither {versions} "
                "(Workload and PodGroup) when raygate started. On Kubernetes 1.36 start kube-apiserver with "
                f"{' '.join(keys.GANG_APISERVER_FLAGS)}, kube-controller-manager with "
                f"{' '.join(keys.GANG_CONTROLLER_MANAGER_FLAGS)} and kube-scheduler with "
                f"{' '.join(keys.GANG_SCHEDULER_FLAGS)} (on 1.37 the API is v1beta1: raygate uses whichever is "
                "served), then restart raygate's webhook and reconciler; or choose another mode (provisioning, "
                "volcano)"]

    # --- at creation (webhook) ------------------------------------------------------------------
    def refusals(self, w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
        seats = {p.name for p in gang.pod_sets if p.in_min_member}
        schedulers = sorted({str(get(w.obj, (*path, "spec", "schedulerName")) or DEFAULT_SCHEDULER)
                             for task, path in w.template_paths() if task in seats})
        if len(schedulers) > 1:
            return [f"the pod templates of the gang name different schedulers ({', '.join(schedulers)}), and "
                    "every pod of a PodGroup must use the same one: give them one schedulerName (or none)"]
        return []

    def apply(self, b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
        hold(b)

    # --- the Workload and the PodGroup (reconciler) -----------------------------------------------
    def resources(self, served: Served) -> dict[ChildKind, Resource]:
        if served.gang_version is None:
            return {}
        return {ChildKind.WORKLOAD: api.gang_workloads(served.gang_version),
                ChildKind.GANG_POD_GROUP: api.gang_pod_groups(served.gang_version)}

    def kind_of(self, obj: Mapping[str, Any]) -> ChildKind:
        return ChildKind.WORKLOAD if obj.get("kind") == WORKLOAD_KIND else ChildKind.GANG_POD_GROUP

    def recorded(self, w: Workload) -> GroupSpec:
        count = min_count(w.gang())
        return GroupSpec(group_name(w, count), {"minCount": count})

    @staticmethod
    def _version(served: Served) -> str:
        return f"{keys.GANG_GROUP}/{served.gang_version or api.ASSUMED_GANG_VERSION}"

    def group_objects(self, w: Workload, spec: GroupSpec, served: Served) -> list[tuple[ChildKind, JSON]]:
        policy = {"gang": {"minCount": spec.spec["minCount"]}}
        workload = {"apiVersion": self._version(served), "kind": WORKLOAD_KIND,
                    "metadata": child_metadata(w, spec.name),
                    "spec": {"controllerRef": {"apiGroup": keys.RAY_GROUP, "kind": w.kind, "name": w.name},
                             "podGroupTemplates": [{"name": keys.GANG_TEMPLATE, "schedulingPolicy": policy}]}}
        group = {"apiVersion": self._version(served), "kind": "PodGroup", "metadata": child_metadata(w, spec.name),
                 "spec": {"podGroupTemplateRef": {"workload": {"workloadName": spec.name,
                                                               "podGroupTemplateName": keys.GANG_TEMPLATE}},
                          "schedulingPolicy": policy}}
        return [(ChildKind.WORKLOAD, workload), (ChildKind.GANG_POD_GROUP, group)]

    def increment_objects(self, w: Workload, name: str, pod_set: str, pods: int,
                          served: Served) -> list[tuple[ChildKind, JSON]]:
        meta = child_metadata(w, name)
        meta["annotations"] |= {keys.SCALE_UP_ANNOTATION: pod_set}
        return [(ChildKind.GANG_POD_GROUP, {"apiVersion": self._version(served), "kind": "PodGroup", "metadata": meta,
                                            "spec": {"schedulingPolicy": {"gang": {"minCount": pods}}}})]

    def is_increment(self, obj: Mapping[str, Any]) -> bool:
        return get(obj, ("metadata", "annotations", keys.SCALE_UP_ANNOTATION)) is not None

    def marks(self, obj: Mapping[str, Any], bound: Mapping[str, int]) -> list[PatchOp]:
        """Record on the gang's PodGroup the Ray cluster whose gang is bound (minCount of its pods on nodes).
        Never taken back: a pod of that cluster made later (a scale-up, a restart) never joins the gang's
        group, where it would wait for a minCount that its bound gang no longer needs (and might not reach)."""
        if self.kind_of(obj) is not ChildKind.GANG_POD_GROUP or self.is_increment(obj):
            return []
        least = get(obj, ("spec", "schedulingPolicy", "gang", "minCount"))
        done = [c for c, n in bound.items() if isinstance(least, int) and n >= least]
        path = ("metadata", "annotations", keys.GANG_BOUND_ANNOTATION)
        if not done or get(obj, path) in done:
            return []
        b = PatchBuilder(obj)
        b.set(path, max(done, key=lambda c: (bound[c], c)))
        return b.ops

    def schedules(self, spec: GroupSpec) -> str:
        return f"PodGroup {spec.name} has kube-scheduler bind its {spec.spec['minCount']} pods together or not at all"

    def admit(self, b: PatchBuilder, w: Workload, spec: GroupSpec) -> None:
        """The group's name on the gang's pod templates (not the submitter's: it starts after the cluster), for
        the pod webhook to copy into every pod: written in the patch that unsuspends, so no pod is made without."""
        for task, path in w.template_paths():
            if task != keys.SUBMITTER_TASK:
                b.set((*path, "metadata", "annotations", keys.GANG_GROUP_ANNOTATION), spec.name)

    def describe(self, spec: GroupSpec, served: Served) -> str:
        where = (f"{keys.GANG_GROUP}/{served.gang_version}, as this cluster serves it" if served.gang_version else
                 f"{self._version(served)} offline: Kubernetes 1.36 serves it, 1.37 v1beta1; --kubeconfig asks")
        return (f"Workload and PodGroup ({where}) with minCount {spec.spec['minCount']}: kube-scheduler binds the "
                "head and workers KubeRay starts together or not at all; the pod webhook names the PodGroup in each "
                "pod's spec.schedulingGroup.podGroupName (a created job's names also hash its uid)")

    # --- at the pod (webhook) -----------------------------------------------------------------------
    def names_group(self, pod: Mapping[str, Any]) -> str | None:
        group = get(pod, ("metadata", "annotations", keys.GANG_GROUP_ANNOTATION))
        return group if isinstance(group, str) and group else None

    def pod_patch(self, b: PatchBuilder, pod: Mapping[str, Any], namespace: str, gated: bool,
                  members: Members) -> None:
        group = self.names_group(pod)
        if group is None:
            return  # not a pod of a gang raygate admitted in native mode
        name = group
        cluster = get(pod, ("metadata", "labels", keys.RAY_CLUSTER_LABEL))
        if gated and isinstance(cluster, str) and cluster and members.bound_cluster(namespace, group) == cluster:
            # Its cluster's gang is bound: a gated pod now is a scale-up's (or a restart's). It joins the increment
            # still open, whose PodGroup is made when its pods are released into their booking, and binds with them.
            pod_set = pod_set_of(pod)
            n = 1
            while members.exists(namespace, increment_name(group, pod_set, n)):
                n += 1
            name = increment_name(group, pod_set, n)
        b.set(("spec", "schedulingGroup"), {"podGroupName": name})

    def pod_problem(self, pod: Mapping[str, Any]) -> str | None:
        group = self.names_group(pod)
        if group is None or get(pod, keys.POD_GROUP_NAME_PATH):
            return None
        return (f"pod {get(pod, ('metadata', 'name')) or ''} belongs to a gang whose PodGroup ({group}) "
                "kube-scheduler binds whole, and would be stored without spec.schedulingGroup.podGroupName: the API "
                f"server dropped the field (kube-apiserver needs {' '.join(keys.GANG_APISERVER_FLAGS)}), or another "
                "mutating webhook removed it, or raygate's did not run (cluster admins: check `kubectl get "
                "mutatingwebhookconfiguration raygate-mutating`)")


RULES = Native()
