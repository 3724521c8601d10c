"""Small object builders for every test, webhook and reconciler, unit and integration, in the style
of Kueue's testingjobs wrappers (import them as `builders`: pytest puts tests/ on sys.path because
conftest.py lives there):

    RayJob("a", "team").worker("gpu", replicas=2, requests={"nvidia.com/gpu": "1"}).obj()

Every builder starts from the smallest manifest the API server accepts and returns a fresh dict
from obj(), so a case can never leak into another.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Self

from raygate.core import keys
from raygate.core.policy import RaygateConfig

IMAGE = "rayproject/ray:2.52.0"
Res = dict[str, str]


def container(
    name: str = "main", *, requests: Res | None = None, limits: Res | None = None,
    restart_policy: str | None = None, image: str = IMAGE,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": image}
    resources: dict[str, Res] = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    if resources:
        c["resources"] = resources
    if restart_policy:
        c["restartPolicy"] = restart_policy
    return c


def pod_template(
    *containers: dict[str, Any], init: list[dict[str, Any]] | None = None, overhead: Res | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = init
    if overhead:
        spec["overhead"] = dict(overhead)
    return {"spec": spec}


def worker_group(
    name: str, *, replicas: int | None = 1, min_replicas: int | None = None, max_replicas: int | None = None,
    hosts: int | None = None, requests: Res | None = None, limits: Res | None = None,
    template: dict[str, Any] | None = None, suspend: bool | None = None,
) -> dict[str, Any]:
    """One entry of workerGroupSpecs."""
    group: dict[str, Any] = {
        "groupName": name, "rayStartParams": {},
        "template": template or pod_template(container("ray-worker", requests=requests, limits=limits)),
    }
    for field, value in (("replicas", replicas), ("minReplicas", min_replicas), ("maxReplicas", max_replicas),
                         ("numOfHosts", hosts), ("suspend", suspend)):
        if value is not None:
            group[field] = value
    return group


class _RayObject:
    kind = ""

    def __init__(self, name: str | None, namespace: str | None) -> None:
        """`namespace` None: none in the manifest (the API server takes the request's)."""
        meta: dict[str, Any] = {} if namespace is None else {"namespace": namespace}
        if name is not None:
            meta["name"] = name
        self._obj: dict[str, Any] = {"apiVersion": "ray.io/v1", "kind": self.kind, "metadata": meta, "spec": {}}

    @property
    def cluster_spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def _start_cluster(self) -> None:
        self.cluster_spec.update({
            "rayVersion": "2.52.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": pod_template(container("ray-head", requests={"cpu": "1", "memory": "2Gi"})),
            },
        })

    # --- metadata ---
    def label(self, key: str, value: str) -> Self:
        self._obj["metadata"].setdefault("labels", {})[key] = value
        return self

    def annotation(self, key: str, value: str) -> Self:
        self._obj["metadata"].setdefault("annotations", {})[key] = value
        return self

    def generate_name(self, prefix: str) -> Self:
        self._obj["metadata"].pop("name", None)
        self._obj["metadata"]["generateName"] = prefix
        return self

    def meta(self, **fields: Any) -> Self:
        """Other metadata as the API server would have set it: meta(uid="u1", resourceVersion="41")."""
        self._obj["metadata"].update(fields)
        return self

    def owned_by_rayjob(self, job: str = "parent") -> Self:
        self._obj["metadata"]["ownerReferences"] = [{
            "apiVersion": "ray.io/v1", "kind": keys.RAYJOB_KIND, "name": job, "uid": "u-" + job,
            "controller": True,
        }]
        return self

    def held(self, state: keys.State = keys.State.PENDING) -> Self:
        """As raygate's webhook leaves a job it holds."""
        self._obj["spec"]["suspend"] = True
        return self.label(keys.STATE_LABEL, state.value).annotation(keys.MODE_ANNOTATION, "provisioning")

    def suspend(self, value: bool) -> Self:
        self._obj["spec"]["suspend"] = value
        return self

    # --- the cluster ---
    def head(self, template: dict[str, Any] | None = None, *, requests: Res | None = None,
             limits: Res | None = None) -> Self:
        self.cluster_spec["headGroupSpec"]["template"] = template or pod_template(
            container("ray-head", requests=requests, limits=limits)
        )
        return self

    def worker(
        self, name: str, *, replicas: int | None = 1, min_replicas: int | None = None,
        max_replicas: int | None = None, hosts: int | None = None, requests: Res | None = None,
        limits: Res | None = None, template: dict[str, Any] | None = None, suspend: bool | None = None,
    ) -> Self:
        return self.groups(worker_group(
            name, replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas, hosts=hosts,
            requests=requests, limits=limits, template=template, suspend=suspend,
        ))

    def groups(self, *groups: dict[str, Any]) -> Self:
        """Worker groups built with worker_group() (or taken from another manifest)."""
        self.cluster_spec.setdefault("workerGroupSpecs", []).extend(copy.deepcopy(list(groups)))
        return self

    def autoscaling(self, resources: dict[str, Res] | None = None) -> Self:
        self.cluster_spec["enableInTreeAutoscaling"] = True
        if resources is not None:
            self.cluster_spec["autoscalerOptions"] = {"resources": resources}
        return self

    def set(self, *path: str | int, value: Any) -> Self:
        """Any other field: set(\"spec\", \"entrypoint\", value=\"python x.py\")."""
        cur: Any = self._obj
        for part in path[:-1]:
            cur = cur[part] if isinstance(part, int) else cur.setdefault(part, {})
        cur[path[-1]] = value
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


class RayJob(_RayObject):
    kind = keys.RAYJOB_KIND

    def __init__(self, name: str | None = "job", namespace: str | None = "team") -> None:
        super().__init__(name, namespace)
        self._obj["spec"] = {"entrypoint": "python -c 'print(1)'", "shutdownAfterJobFinishes": True,
                             "rayClusterSpec": {}}
        self._start_cluster()

    @property
    def cluster_spec(self) -> dict[str, Any]:
        return self._obj["spec"].setdefault("rayClusterSpec", {})  # type: ignore[no-any-return]

    def shutdown_after_finish(self, value: bool | None) -> Self:
        if value is None:
            self._obj["spec"].pop("shutdownAfterJobFinishes", None)
        else:
            self._obj["spec"]["shutdownAfterJobFinishes"] = value
        return self

    def submission_mode(self, mode: str) -> Self:
        self._obj["spec"]["submissionMode"] = mode
        return self

    def submitter(self, template: dict[str, Any]) -> Self:
        self._obj["spec"]["submitterPodTemplate"] = template
        return self

    def cluster_selector(self, **labels: str) -> Self:
        self._obj["spec"]["clusterSelector"] = dict(labels)
        return self

    def without_cluster_spec(self) -> Self:
        self._obj["spec"].pop("rayClusterSpec", None)
        return self


class RayCluster(_RayObject):
    kind = keys.RAYCLUSTER_KIND

    def __init__(self, name: str | None = "cluster", namespace: str | None = "team") -> None:
        super().__init__(name, namespace)
        self._start_cluster()

    @property
    def cluster_spec(self) -> dict[str, Any]:
        return self._obj["spec"]  # type: ignore[no-any-return]


_uids = itertools.count(1)


def gpu_job(name: str = "job", namespace: str | None = None, *, gpus_per_worker: int = 1) -> RayJob:
    """A RayJob whose 2 workers each limit nvidia.com/gpu: the gang raygate exists for."""
    job = RayJob(name) if namespace is None else RayJob(name, namespace)
    return job.worker(
        "gpu", replicas=2, requests={"cpu": "1", "memory": "4Gi"}, limits={"nvidia.com/gpu": str(gpus_per_worker)}
    )


def review(
    obj: dict[str, Any] | None, *, operation: str = "CREATE", old: dict[str, Any] | None = None,
    user: str = "alice", namespace: str | None = None, dry_run: bool = False, uid: str | None = None,
) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it."""
    some = obj or old or {}
    kind = str(some.get("kind", keys.RAYJOB_KIND))
    meta = some.get("metadata") or {}
    request: dict[str, Any] = {
        "uid": uid or f"uid-{next(_uids)}",
        "kind": {"group": keys.RAY_GROUP, "version": keys.RAY_VERSION, "kind": kind},
        "resource": {"group": keys.RAY_GROUP, "version": keys.RAY_VERSION,
                     "resource": keys.RAYJOB_PLURAL if kind == keys.RAYJOB_KIND else keys.RAYCLUSTER_PLURAL},
        "operation": operation,
        "namespace": namespace if namespace is not None else meta.get("namespace", "team"),
        "name": meta.get("name", ""),
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def request(obj: dict[str, Any] | None, **kwargs: Any) -> Any:
    """Just the request of review(); typed loosely so tests can pass it to mutate()/validate()."""
    return review(obj, **kwargs)["request"]


def config(namespaces: dict[str, dict[str, Any]] | None = None, **defaults: Any) -> RaygateConfig:
    """A RaygateConfig from camelCase default fields: config(mode="volcano", queueName="q")."""
    raw: dict[str, Any] = {"defaults": defaults}
    if namespaces:
        raw["namespaces"] = namespaces
    return RaygateConfig.model_validate(raw)
