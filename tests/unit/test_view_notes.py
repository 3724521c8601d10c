"""The notes that cover the caches' lag behind the reconciler's own writes (reconciler/view.py): a reconcile right
after a write sees what it wrote, and the cache's own view once it has caught up.

Cache events are applied directly (no API server): this is the bookkeeping alone; the reconciler's integration
tests run it against the real one."""

from __future__ import annotations

from typing import Any

from raygate.core import keys
from raygate.core.api import provisioning_requests
from raygate.core.keys import ChildKind
from raygate.core.objects import Key
from raygate.kube.informer import Informer
from raygate.reconciler.view import Notes

JOB = Key(keys.RAYJOB_KIND, "ns", "train")


def request(name: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "ownerReferences": [
        {"apiVersion": "ray.io/v1", "kind": keys.RAYJOB_KIND, "name": "train", "uid": "u1", "controller": True}]}}


def notes() -> tuple[Notes, Informer]:
    cache = Informer(None, provisioning_requests("v1"), compact=True)  # type: ignore[arg-type]
    return Notes({ChildKind.PROVISIONING_REQUEST: cache}), cache


def cached(cache: Informer, notes: Notes, event: str, obj: dict[str, Any]) -> None:
    """The cache sees `obj`, and the reconciler's handler tells the notes, as the controller's does."""
    cache._apply({"type": event, "object": obj})
    notes.cache_event(event, (ChildKind.PROVISIONING_REQUEST, "ns", obj["metadata"]["name"]), JOB)


def names(found: dict[ChildKind, list[dict[str, Any]]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in found[ChildKind.PROVISIONING_REQUEST])


def test_a_job_is_read_as_our_patch_returned_it_until_the_cache_moves_past_the_version_it_replaced() -> None:
    n, _ = notes()
    old = {"metadata": {"name": "train", "resourceVersion": "5"}, "spec": {"suspend": True}}
    ours = {"metadata": {"name": "train", "resourceVersion": "6"}, "spec": {"suspend": False}}
    n.patched(JOB, "5", ours)
    assert n.job(JOB, old) == ours
    assert n.job(JOB, old) == ours  # read again: the note stays while the cache lags
    caught_up = {"metadata": {"name": "train", "resourceVersion": "6"}, "spec": {"suspend": False, "x": 1}}
    assert n.job(JOB, caught_up) is caught_up
    assert n.job(JOB, old) is old  # the note went once the cache moved on
    assert n.job(JOB, None) is None


def test_two_patches_in_a_row_are_read_as_the_second_returned_it_while_the_cache_is_behind_both() -> None:
    n, _ = notes()
    first = {"metadata": {"name": "train", "resourceVersion": "5"}, "spec": {"suspend": True}}
    n.patched(JOB, "5", {"metadata": {"name": "train", "resourceVersion": "6"}, "spec": {"suspend": True}})
    second = {"metadata": {"name": "train", "resourceVersion": "7"}, "spec": {"suspend": False}}
    n.patched(JOB, "6", second)
    assert n.job(JOB, first) == second  # not the version both patches replaced, which would be decided on again
    between = {"metadata": {"name": "train", "resourceVersion": "6"}, "spec": {"suspend": True}}
    assert n.job(JOB, between) == second
    n.patched(JOB, "9", {"metadata": {"name": "train", "resourceVersion": "10"}})  # from another version: a new note
    assert n.job(JOB, first) is first


def test_a_child_just_created_is_the_jobs_and_one_just_deleted_is_not_until_the_cache_says_so() -> None:
    n, cache = notes()
    cached(cache, n, "ADDED", request("old"))
    n.written((ChildKind.PROVISIONING_REQUEST, "ns", "new"), request("new"))
    n.deleted((ChildKind.PROVISIONING_REQUEST, "ns", "old"))
    assert names(n.children_of(JOB)) == ["new"]
    cached(cache, n, "ADDED", request("new", "2"))
    cached(cache, n, "DELETED", request("old", "3"))
    assert names(n.children_of(JOB)) == ["new"]
    assert n.children_of(JOB)[ChildKind.PROVISIONING_REQUEST][0]["metadata"]["resourceVersion"] == "2"  # the cache's
    assert names(n.children_of(Key(keys.RAYJOB_KIND, "ns", "other"))) == []
