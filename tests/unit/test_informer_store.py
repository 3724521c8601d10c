"""The informer's store: compact (JSON bytes) or parsed, the transform, and what reads return; the
controller's pure helpers beside it.

Events are applied directly (no API server): what is stored and returned is pure bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest

from raygate.core.api import RAYJOBS
from raygate.core.booking import settled
from raygate.kube.informer import Informer
from raygate.reconciler.controller import _with_templates_grouped
from raygate.reconciler.event_sender import event_subject
from raygate.reconciler.plan import Create, Delete
from raygate.reconciler.view import child_view, slim


def job(name: str, rv: str = "1", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "managedFields": [{"m": 1}]},
            "spec": {"suspend": True}, **extra}


def informer(compact: bool, transform: Any = None) -> Informer:
    return Informer(None, RAYJOBS, compact=compact, transform=transform)  # type: ignore[arg-type]


@pytest.mark.parametrize("compact", [False, True])
def test_events_keep_the_store_current(compact: bool) -> None:
    inf = informer(compact, slim)
    seen: list[tuple[str, str]] = []
    inf.handler = lambda kind, obj: seen.append((kind, obj["metadata"]["resourceVersion"]))
    inf._apply({"type": "ADDED", "object": job("a")})
    inf._apply({"type": "ADDED", "object": job("b")})
    inf._apply({"type": "MODIFIED", "object": job("a", "2")})
    inf._apply({"type": "DELETED", "object": job("b", "3")})
    assert inf.get("ns", "a") == {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "2"},
                                  "spec": {"suspend": True}}
    assert inf.get("ns", "b") is None
    assert inf.cached_keys() == [("ns", "a")]
    assert [o["metadata"]["name"] for o in inf.iter_items()] == ["a"]
    assert seen == [("ADDED", "1"), ("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "3")]


def test_a_compact_store_holds_bytes_and_every_read_is_a_copy_of_its_own() -> None:
    inf = informer(True)
    inf._apply({"type": "ADDED", "object": job("a")})
    assert all(isinstance(v, bytes) for v in inf._store.values())
    first = inf.get("ns", "a")
    assert first is not None
    first["spec"]["suspend"] = False  # a caller's edit is not the cache's
    assert inf.get("ns", "a") == job("a")


def test_a_bookmark_changes_nothing_and_an_error_asks_for_a_relist() -> None:
    inf = informer(True)
    assert inf._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) == "9"
    assert inf._apply({"type": "ERROR", "object": {"code": 410}}) is None
    assert inf.cached_keys() == []


@pytest.mark.parametrize(("obj", "view"), [
    ({"metadata": {"name": "t", "managedFields": []}, "template": {"spec": {"containers": []}}},
     {"metadata": {"name": "t"}}),
    ({"metadata": {"name": "r"}, "spec": {"podSets": []}, "status": {"conditions": []}},
     {"metadata": {"name": "r"}, "spec": {"podSets": []}, "status": {"conditions": []}}),
    ({"metadata": {"name": "pg"}, "spec": {"minMember": 3}}, {"metadata": {"name": "pg"}, "spec": {"minMember": 3}}),
])
def test_a_child_is_cached_without_a_templates_bulk(obj: dict[str, Any], view: dict[str, Any]) -> None:
    assert child_view(obj) == view


def cond(kind: str, status: str = "True") -> dict[str, Any]:
    return {"type": kind, "status": status}


@pytest.mark.parametrize(("conditions", "urgent"), [
    ([], False),
    ([cond("Accepted")], False),
    ([cond("Accepted"), cond("Provisioned", "False")], False),
    ([cond("Accepted"), cond("Provisioned")], True),
    ([cond("Failed")], True),
    ([cond("BookingExpired")], True),
    ([cond("CapacityRevoked")], True),
])
def test_a_request_that_settled_makes_its_job_urgent(conditions: list[dict[str, Any]], urgent: bool) -> None:
    assert settled({"status": {"conditions": conditions}}) is urgent


def test_a_queued_event_keeps_only_what_it_refers_to() -> None:
    j = {"apiVersion": "ray.io/v1", "kind": "RayJob", **job("a"), "status": {"big": "x" * 1000}}
    assert event_subject(j) == {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {
        "name": "a", "namespace": "ns", "uid": None, "resourceVersion": "1"}}


def test_a_jobs_podtemplates_are_grouped_to_be_created_side_by_side() -> None:
    def tpl(name: str) -> Create:
        return Create("PodTemplate", {"metadata": {"name": name}})

    pr = Create("ProvisioningRequest", {"metadata": {"name": "pr"}})
    old = Delete("PodTemplate", "old")
    a, b = tpl("a"), tpl("b")
    # Two or more in a row go together; the request that names them comes after, on its own.
    assert list(_with_templates_grouped([a, b, old, pr])) == [[a, b], old, pr]
    assert list(_with_templates_grouped([a, pr])) == [a, pr]  # one alone is just an action
    assert list(_with_templates_grouped([pr, a, b])) == [pr, [a, b]]
