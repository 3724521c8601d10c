"""The reconciler's pod index under its two writers: the pods' watch and the jobs' (reresolve)."""

from __future__ import annotations

import threading
from typing import cast

from raygate.core import identity, keys
from raygate.core.objects import JSON, Key, PodKey
from raygate.core.policy import NamespacePolicy
from raygate.kube.client import Kube
from raygate.reconciler.pods import PodIndex

NS = "ns"
JOB = Key(keys.RAYJOB_KIND, NS, "train")


def gated_pod(name: str) -> JSON:
    record = identity.RayOwner(keys.RAYJOB_KIND, JOB.name, "uid-1", "gpu").render()
    return {"metadata": {"namespace": NS, "name": name, "resourceVersion": "1", "labels": {keys.POD_GATE_LABEL: "true"},
                         "annotations": {keys.RAY_OWNER_ANNOTATION: record}},
            "spec": {"schedulingGates": [{"name": keys.CAPACITY_GATE}]}}


def test_an_owner_read_just_before_its_job_went_is_never_filed_after_the_jobs_reresolve() -> None:
    """A gated pod arrives as its RayJob is deleted: the pods' thread reads the job from the caches, the job
    leaves them and the jobs' thread re-resolves its pods, then the pods' thread files what it read. The pod must
    end as no live job's, handed to the worker that says why it stays gated, not filed under the deleted job."""
    jobs = {JOB.name: "uid-1"}  # the jobs' cache: name -> uid
    read, resume = threading.Event(), threading.Event()
    unowned: list[PodKey] = []

    def owner_of(kind: str, namespace: str, name: str, uid: str) -> Key | None:
        found = jobs.get(name) == uid
        if threading.current_thread().name == "pods":
            read.set()
            resume.wait(5)  # descheduled between its read and its write
        return Key(kind, namespace, name) if found else None

    index = PodIndex(cast(Kube, None), 300, 500, owner_of=owner_of, on_change=lambda _: None,
                     on_unowned=unowned.append, on_consumers=lambda _ns, _r: None)
    watch = index.informers[0]  # the gated pods' watch: it caches the pod, then calls the index
    pods = threading.Thread(target=watch._apply, args=({"type": "ADDED", "object": gated_pod("w1")},), name="pods")
    pods.start()
    assert read.wait(5)
    del jobs[JOB.name]  # DELETED: the cache drops the job, then its handler re-resolves the job's pods
    found: list[PodKey] = []
    jobs_thread = threading.Thread(target=lambda: found.extend(index.reresolve(JOB.kind, NS, JOB.name)),
                                   name="jobs")
    jobs_thread.start()
    jobs_thread.join(0.3)  # serialized: it waits for the pod's owner read to be filed
    resume.set()
    pods.join(5)
    jobs_thread.join(5)
    assert found + unowned == [PodKey(NS, "w1")], "the pod's stay in the gate was never explained"
    assert index.pods_of(JOB, NamespacePolicy(), None) == (), "the pod is still filed under the deleted job"
