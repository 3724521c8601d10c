"""One place that knows how RayJobs and RayClusters are shaped: their pod sets, where their pod
templates live, how they are suspended, and the gang they need.

Everything here is pure: it reads a manifest (a dict as the API server returns it) and never
performs I/O. Both the webhook and the reconciler use it, so they can never disagree on a gang.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raygate.core import dra, identity, keys
from raygate.core import quantity as q
from raygate.core.objects import JSON, Path, get

Obj = Mapping[str, Any]
Manages = Callable[[str], bool]  # whether a resource name is one raygate books (NamespacePolicy.manages)


class ManifestError(ValueError):
    """The manifest cannot be read; the message names the field and what to change."""


@dataclass(frozen=True)
class PodSet:
    name: str  # Volcano task name: headgroup, <worker group name>, submittergroup
    count: int  # pods KubeRay creates at start: what raygate books
    per_pod: q.Resources  # the scheduler's effective request of one pod
    template_path: Path | None  # where its pod template lives in the object (None: KubeRay's default)
    in_min_member: bool = True  # the K8sJobMode submitter waits for the cluster, so it is not
    # With in-tree autoscaling: Volcano's share of minMember (minReplicas x hosts, as KubeRay's own
    # Volcano plugin counts) and the most pods the Ray autoscaler may run (maxReplicas x hosts).
    min_count: int | None = None
    max_count: int | None = None
    # DRA claims of its pods that could not be counted (dra.py says which and why).
    uncounted: tuple[str, ...] = ()

    @property
    def gang_count(self) -> int:
        """Pods that must be schedulable together for Volcano (minMember, minResources)."""
        return self.count if self.min_count is None else self.min_count

    @property
    def ceiling(self) -> int:
        """Most pods this set can ever have without an edit of the object."""
        return self.count if self.max_count is None else max(self.count, self.max_count)

    @property
    def total(self) -> q.Resources:
        return {k: v * self.count for k, v in self.per_pod.items()}

    @property
    def gang_total(self) -> q.Resources:
        return {k: v * self.gang_count for k, v in self.per_pod.items()}

    @property
    def ceiling_total(self) -> q.Resources:
        return {k: v * self.ceiling for k, v in self.per_pod.items()}

    def requests_any(self, manages: Manages) -> bool:
        return any(v > 0 and manages(r) for r, v in self.per_pod.items())

    def managed(self, manages: Manages) -> q.Resources:
        """What one pod asks of the resources raygate books."""
        return {r: v for r, v in self.per_pod.items() if v > 0 and manages(r)}


@dataclass(frozen=True)
class Gang:
    pod_sets: tuple[PodSet, ...]

    @property
    def min_member(self) -> int:
        return sum(p.gang_count for p in self.pod_sets if p.in_min_member)

    @property
    def min_task_member(self) -> dict[str, int]:
        return {p.name: p.gang_count for p in self.pod_sets if p.in_min_member and p.gang_count > 0}

    @property
    def min_resources(self) -> q.Resources:
        """Volcano's minResources: the gang that must fit at once (in resources a node offers: DRA devices,
        which no node lists as allocatable, are left out)."""
        total = q.total(p.gang_total for p in self.pod_sets)
        return {k: v for k, v in total.items() if not dra.is_device_resource(k)}

    @property
    def start_resources(self) -> q.Resources:
        """What KubeRay's pods request at start: what raygate books and maxGang limits."""
        return q.total(p.total for p in self.pod_sets)

    @property
    def ceiling_pods(self) -> int:
        """The most pods the object can ever run (every set at its ceiling)."""
        return sum(p.ceiling for p in self.pod_sets)

    @property
    def ceiling_resources(self) -> q.Resources:
        """What those pods request: what maxGang limits."""
        return q.total(p.ceiling_total for p in self.pod_sets)

    def managed_pod_sets(self, manages: Manages) -> list[PodSet]:
        return [p for p in self.pod_sets if p.count > 0 and p.requests_any(manages)]

    def to_json(self) -> dict[str, Any]:
        sets = []
        for p in self.pod_sets:
            entry: dict[str, Any] = {"name": p.name, "count": p.count, "resources": q.render(p.per_pod)}
            if p.gang_count != p.count:
                entry["minMemberCount"] = p.gang_count  # Volcano's count differs (in-tree autoscaling)
            if p.ceiling != p.count:
                entry["maxCount"] = p.ceiling
            sets.append(entry)
        return {"minMember": self.min_member, "minResources": q.render(self.min_resources), "podSets": sets}


# --- reading fields -------------------------------------------------------------------------------

def _where(path: Path) -> str:
    return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")


def _as_mapping(value: Any, path: Path, *, required: bool = False) -> Mapping[str, Any]:
    """`value`, read from `path` (the full path, for the message), as an object; absent is empty."""
    if type(value) is dict:  # decoded JSON: skips the slower ABC check below
        return value
    if value is None:
        if required:
            raise ManifestError(f"{_where(path)} is missing")
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{_where(path)} must be an object")
    return value


def _as_list(value: Any, path: Path) -> list[Any]:
    if type(value) is list:
        return value
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError(f"{_where(path)} must be a list")
    return value


def _as_int(value: Any, path: Path, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"{_where(path)} must be a non-negative integer, not {value!r}")
    return value


def _mapping(obj: Any, path: Path, *, required: bool = False) -> Mapping[str, Any]:
    return _as_mapping(get(obj, path), path, required=required)


def _strings(obj: Any, path: Path) -> Mapping[str, str]:
    """A map of strings, as the API server keeps labels and annotations; anything else is unreadable."""
    found = _mapping(obj, path)
    for k, v in found.items():
        if type(v) is not str:
            raise ManifestError(f"{_where((*path, k))} must be a string, not {type(v).__name__}")
    return found


def _list(obj: Any, path: Path) -> list[Any]:
    return _as_list(get(obj, path), path)


def _parse_quantities(values: Mapping[str, Any], path: Path) -> q.Resources:
    out: q.Resources = {}
    for name, value in values.items():
        try:
            out[name] = q.parse(value)
        except q.QuantityError as err:
            raise ManifestError(f"{_where((*path, name))}: {err}") from None
    return out


def _resources(value: Any, path: Path) -> q.Resources:
    """A `resources` object's request per resource: requests[r], or limits[r] where no request is given."""
    res = _as_mapping(value, path)
    limits = _parse_quantities(_as_mapping(res.get("limits"), (*path, "limits")), (*path, "limits"))
    return limits | _parse_quantities(_as_mapping(res.get("requests"), (*path, "requests")), (*path, "requests"))


def _container_request(container: Any, path: Path) -> q.Resources:
    return _resources(_as_mapping(container, path).get("resources"), (*path, "resources"))


def pod_request(template: Any, path: Path) -> q.Resources:
    """The Kubernetes scheduler's effective pod request for a pod template at `path`.

    Regular containers and native sidecars (init containers with restartPolicy Always) add up;
    each ordinary init container runs alone beside the sidecars started before it, so the pod
    needs the larger of the two; pod overhead comes on top. Every field is read once, straight
    from its parent (this runs on each admission), and errors name its full path.
    """
    spec_path = (*path, "spec")
    spec = _as_mapping(_as_mapping(template, path).get("spec"), spec_path)
    total: q.Resources = {}
    containers_path = (*spec_path, "containers")
    for i, c in enumerate(_as_list(spec.get("containers"), containers_path)):
        total = q.add(total, _container_request(c, (*containers_path, i)))
    sidecars: q.Resources = {}
    init_peak: q.Resources = {}
    init_path = (*spec_path, "initContainers")
    for i, c in enumerate(_as_list(spec.get("initContainers"), init_path)):
        req = _container_request(c, (*init_path, i))
        if c.get("restartPolicy") == "Always":
            total = q.add(total, req)
            sidecars = q.add(sidecars, req)
            init_peak = q.maximum(init_peak, sidecars)
        else:
            init_peak = q.maximum(init_peak, q.add(req, sidecars))
    total = q.maximum(total, init_peak)
    overhead_path = (*spec_path, "overhead")
    return q.add(total, _parse_quantities(_as_mapping(spec.get("overhead"), overhead_path), overhead_path))


# --- the two kinds ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """A RayJob or a RayCluster, seen through what gang admission needs."""

    obj: Obj
    # Where DRA claim templates are looked up (the caller's cache); unseen ones are not counted.
    claim_templates: dra.ClaimTemplates = field(default=dra.no_templates, compare=False, repr=False)

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def is_job(self) -> bool:
        return self.kind == keys.RAYJOB_KIND

    @property
    def name(self) -> str:
        return str(get(self.obj, ("metadata", "name"), "") or get(self.obj, ("metadata", "generateName"), ""))

    @property
    def namespace(self) -> str:
        return str(get(self.obj, ("metadata", "namespace"), ""))

    @property
    def uid(self) -> str:
        return str(get(self.obj, ("metadata", "uid"), ""))

    @property
    def labels(self) -> Mapping[str, str]:
        return _strings(self.obj, ("metadata", "labels"))

    @property
    def annotations(self) -> Mapping[str, str]:
        return _strings(self.obj, ("metadata", "annotations"))

    @property
    def cluster_spec_path(self) -> Path:
        return ("spec", "rayClusterSpec") if self.is_job else ("spec",)

    @property
    def cluster_spec(self) -> Mapping[str, Any]:
        return _mapping(self.obj, self.cluster_spec_path)

    @property
    def suspended(self) -> bool:
        return get(self.obj, ("spec", "suspend")) is True

    @property
    def pod_group_name(self) -> str:
        # The name KubeRay's own Volcano integration uses, so the two can never create two groups.
        return f"ray-{self.name}-pg"

    @property
    def submission_mode(self) -> str:
        return str(get(self.obj, ("spec", "submissionMode")) or "K8sJobMode")

    @property
    def autoscaling(self) -> bool:
        return get(self.cluster_spec, ("enableInTreeAutoscaling",)) is True

    def worker_groups(self) -> list[tuple[int, Mapping[str, Any]]]:
        groups = _as_list(self.cluster_spec.get("workerGroupSpecs"), (*self.cluster_spec_path, "workerGroupSpecs"))
        for i, g in enumerate(groups):
            if not isinstance(g, Mapping):
                raise ManifestError(f"{_where((*self.cluster_spec_path, 'workerGroupSpecs', i))} must be an object")
        return list(enumerate(groups))

    def template_paths(self) -> list[tuple[str, Path]]:
        """(task name, path) of every pod template raygate may annotate, submitter included."""
        base = self.cluster_spec_path
        out = [(keys.HEAD_GROUP_TASK, (*base, "headGroupSpec", "template"))]
        for i, g in self.worker_groups():
            out.append((str(g.get("groupName", f"group-{i}")), (*base, "workerGroupSpecs", i, "template")))
        if self.is_job and self.submission_mode == "K8sJobMode" and get(self.obj, ("spec", "submitterPodTemplate")):
            out.append((keys.SUBMITTER_TASK, ("spec", "submitterPodTemplate")))
        return out

    def _pod(self, template: Mapping[str, Any], path: Path) -> tuple[q.Resources, tuple[str, ...]]:
        """One pod's effective request, the DRA devices it claims included, and the claims not counted."""
        per_pod = pod_request(template, path)
        if not get(template, ("spec", "resourceClaims")):
            return per_pod, ()
        devices, uncounted = dra.pod_devices(template, _where(path), self.namespace, self.claim_templates)
        return q.add(per_pod, devices), tuple(uncounted)

    def gang(self) -> Gang:
        """Head + worker groups (+ submitter), with the undercounts of KubeRay's own rule fixed."""
        base = self.cluster_spec_path
        spec = self.cluster_spec
        autoscaling = spec.get("enableInTreeAutoscaling") is True
        submission = self.submission_mode if self.is_job else None
        head_path = (*base, "headGroupSpec", "template")
        head_template = get(spec, ("headGroupSpec", "template"))
        if not isinstance(head_template, Mapping):
            raise ManifestError(f"{_where(head_path)} is missing: a Ray cluster needs a head pod template")
        head, head_uncounted = self._pod(head_template, head_path)
        if autoscaling:
            opts = (*base, "autoscalerOptions", "resources")
            sidecar = (_resources(get(spec, opts[len(base):]), opts)
                       or _parse_quantities(keys.AUTOSCALER_DEFAULT_RESOURCES, ()))
            head = q.add(head, sidecar)
        if submission == "SidecarMode":
            head = q.add(head, _parse_quantities(keys.SUBMITTER_DEFAULT_REQUESTS, ()))
        sets = [PodSet(keys.HEAD_GROUP_TASK, 1, head, head_path, uncounted=head_uncounted)]
        for i, g in self.worker_groups():
            path = (*base, "workerGroupSpecs", i)
            if g.get("suspend") is True:
                continue
            lo = _as_int(g.get("minReplicas"), (*path, "minReplicas"), 0)
            hi = _as_int(g.get("maxReplicas"), (*path, "maxReplicas"), keys.MAX_REPLICAS_DEFAULT)
            if lo > hi:
                raise ManifestError(f"{_where(path)}: minReplicas {lo} is larger than maxReplicas {hi}")
            # KubeRay starts `replicas` pods, clamped to [min, max], with or without the autoscaler; this is
            # what gets booked. Volcano's minMember counts minReplicas under autoscaling (KubeRay's plugin).
            replicas = min(max(_as_int(g.get("replicas"), (*path, "replicas"), lo), lo), hi)
            hosts = _as_int(g.get("numOfHosts"), (*path, "numOfHosts"), 1) or 1
            template = g.get("template")
            if not isinstance(template, Mapping):
                raise ManifestError(f"{_where((*path, 'template'))} is missing")
            name = g.get("groupName")
            if not isinstance(name, str) or not name:
                raise ManifestError(f"{_where((*path, 'groupName'))} must be a non-empty string")
            per_pod, uncounted = self._pod(template, (*path, "template"))
            sets.append(PodSet(name, replicas * hosts, per_pod, (*path, "template"),
                               min_count=lo * hosts if autoscaling else None,
                               max_count=hi * hosts if autoscaling else None, uncounted=uncounted))
        if submission == "K8sJobMode":
            tpl_path: Path = ("spec", "submitterPodTemplate")
            tpl = get(self.obj, tpl_path)
            if isinstance(tpl, Mapping):
                per_pod, uncounted = self._pod(tpl, tpl_path)
                sets.append(PodSet(keys.SUBMITTER_TASK, 1, per_pod, tpl_path, in_min_member=False,
                                   uncounted=uncounted))
            else:
                default = _parse_quantities(keys.SUBMITTER_DEFAULT_REQUESTS, ())
                sets.append(PodSet(keys.SUBMITTER_TASK, 1, default, None, in_min_member=False))
        return Gang(tuple(sets))

    @property
    def uses_cluster_selector(self) -> bool:
        """A RayJob that runs on an existing cluster: KubeRay creates no pods for it but a submitter."""
        return self.is_job and bool(get(self.obj, ("spec", "clusterSelector"))) and not get(
            self.obj, ("spec", "rayClusterSpec"))

    def finished(self) -> bool:
        """A RayJob that reached a terminal state; its capacity booking can go."""
        if not self.is_job:
            return False
        status = _mapping(self.obj, ("status",))
        return status.get("jobDeploymentStatus") in KUBERAY_TERMINAL or status.get("jobStatus") in {
            "SUCCEEDED", "FAILED", "STOPPED"
        }

    def rejected_by_kuberay(self) -> str | None:
        """KubeRay's message when it refused this RayJob for good (it never runs, even if fixed)."""
        if not self.is_job:
            return None
        status = _mapping(self.obj, ("status",))
        if status.get("jobDeploymentStatus") != KUBERAY_VALIDATION_FAILED:
            return None
        return str(status.get("message") or status.get("reason") or KUBERAY_VALIDATION_FAILED)

    def rayjob_parent(self) -> tuple[str, str] | None:
        """(name, uid) of the RayJob this object's controller ownerReference names, as written.

        This is a claim, not a fact: anyone who may create a RayCluster may write any ownerReference.
        Who made the request, or the RayJob itself, has to confirm it.
        """
        if self.kind != keys.RAYCLUSTER_KIND:
            return None
        refs = get(self.obj, ("metadata", "ownerReferences"))
        for ref in refs if isinstance(refs, list) else []:
            if (isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("kind") == keys.RAYJOB_KIND
                    and str(ref.get("apiVersion", "")).startswith(keys.RAY_GROUP + "/")):
                return str(ref.get("name") or ""), str(ref.get("uid") or "")
        return None


DEFAULT_SCHEDULER = "default-scheduler"


def owner_reference(w: Workload) -> JSON:
    """The controller reference raygate's children carry to their job (garbage collected with it)."""
    return {
        "apiVersion": f"{keys.RAY_GROUP}/{keys.RAY_VERSION}",
        "kind": w.kind,
        "name": w.name,
        "uid": str(get(w.obj, ("metadata", "uid"), "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(w: Workload, name: str) -> JSON:
    """Metadata of an object raygate creates for a job: owned by it, labelled so raygate's watches see it."""
    return {
        "name": name,
        "namespace": w.namespace,
        "labels": {keys.MANAGED_BY_LABEL: keys.MANAGED_BY_VALUE},
        # Its job by name and uid, also where the garbage collector cannot strip it (--cascade=orphan).
        "annotations": {keys.RAY_OWNER_ANNOTATION: identity.child_record(w.kind, w.name, w.uid)},
        "ownerReferences": [owner_reference(w)],
    }


KUBERAY_VALIDATION_FAILED = "ValidationFailed"
# jobDeploymentStatus values after which KubeRay never starts the job's pods again.
KUBERAY_TERMINAL = frozenset({"Complete", "Failed", KUBERAY_VALIDATION_FAILED})
