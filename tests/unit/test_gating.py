"""Which gated pods a booking covers, and what a scale-up books: the pure plan behind the pod gate."""

from __future__ import annotations

from typing import Any

from raygate.core import keys
from raygate.core.times import parse_time
from raygate.reconciler import gating
from raygate.reconciler.gating import Pod

GPU_DIGEST = "d-gpu"
PROVISIONED = [("Accepted", "True"), ("Provisioned", "True")]


def template(name: str, pod_set: str = "gpu", digest: str = GPU_DIGEST) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {keys.POD_SET_ANNOTATION: pod_set,
                                                       keys.PLACEMENT_ANNOTATION: digest}}}


def request(name: str, count: int, *conds: tuple[str, str], tpl: str = "t-gpu", scale_up: bool = False,
            created: str = "2030-01-01T00:00:00Z") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if scale_up:
        meta["annotations"] = {keys.SCALE_UP_ANNOTATION: "gpu"}
    return {"metadata": meta, "spec": {"podSets": [{"podTemplateRef": {"name": tpl}, "count": count}]},
            "status": {"conditions": [{"type": t, "status": s, "reason": t} for t, s in conds]}}


def gated(name: str, digest: str = GPU_DIGEST, created: str = "2030-01-01T00:00:01Z", arrived: int = 0) -> Pod:
    return Pod(name, created, "gpu", gated=True, runs=True, consumes=None, digest=digest, obj={"metadata": {}},
               arrived=arrived)


def released(name: str, request_name: str, runs: bool = True) -> Pod:
    return Pod(name, "2030-01-01T00:00:00Z", "gpu", gated=False, runs=runs, consumes=request_name)


TEMPLATES = [template("t-gpu"), template("t-gpu-s")]


def plan(pods: list[Pod], requests: list[dict[str, Any]], scale_ups: list[dict[str, Any]] | None = None,
         room: int = 100, most: int = 100) -> gating.GatePlan:
    return gating.plan(pods, requests, scale_ups or [], TEMPLATES, room=room, most_per_request=most)


def released_into(p: gating.GatePlan) -> list[tuple[str, str]]:
    return [(pod.name, r) for pod, r in p.release]


def test_the_admitted_gang_is_released_into_its_booking_and_no_slot_twice() -> None:
    p = plan([gated("a"), gated("b"), gated("c")], [request("gang", 2, *PROVISIONED)])
    assert released_into(p) == [("a", "gang"), ("b", "gang")]
    assert [(key, n) for key, n, _ in p.create] == [(("gpu", GPU_DIGEST), 1)]  # the third is a scale-up


def test_pods_created_in_the_same_second_are_served_in_the_order_they_came() -> None:
    """creationTimestamps have one-second resolution: the order the reconciler saw the pods in decides, not their
    names (a Job's pod "submits-again-..." sorts before "submits-x..." whichever came first)."""
    p = plan([gated("submits-again-b7d4m", arrived=2), gated("submits-xk2pq", arrived=1)],
             [request("gang", 1, *PROVISIONED)])
    assert released_into(p) == [("submits-xk2pq", "gang")]


def test_pods_already_released_fill_their_slots_whoever_released_them() -> None:
    """A new leader counts from the pods: two slots, two released and running pods, nothing more to release."""
    p = plan([released("a", "gang"), released("b", "gang"), gated("c")], [request("gang", 2, *PROVISIONED)])
    assert p.release == [] and [n for _, n, _ in p.create] == [1]
    ended = plan([released("a", "gang"), released("b", "gang", runs=False), gated("c")],
                 [request("gang", 2, *PROVISIONED)])
    assert released_into(ended) == [("c", "gang")]  # a pod that ended frees its slot for its replacement


def test_nothing_is_released_before_provisioned() -> None:
    p = plan([gated("a")], [request("gang", 2, ("Accepted", "True"))])
    assert p.release == [] and p.waiting == {("gpu", GPU_DIGEST): 1}


def test_a_pod_placed_otherwise_than_its_booking_is_not_covered_by_it() -> None:
    p = plan([gated("a", digest="d-other-zone")], [request("gang", 2, *PROVISIONED)])
    assert p.release == [] and [(key, n) for key, n, _ in p.create] == [(("gpu", "d-other-zone"), 1)]


def test_overlapping_scale_ups_each_book_their_increment() -> None:
    first = request("up-1", 2, ("Accepted", "True"), tpl="t-gpu-s", scale_up=True)
    p = plan([released("a", "gang"), gated("b"), gated("c"), gated("d")], [request("gang", 1, *PROVISIONED)],
             [first])
    assert [n for _, n, _ in p.create] == [1] and p.delete == []  # 3 wait: 2 already asked for, 1 more


def test_pods_gone_before_their_scale_up_provisioned_shrink_it() -> None:
    first = request("up-1", 3, ("Accepted", "True"), tpl="t-gpu-s", scale_up=True)
    p = plan([gated("b")], [request("gang", 0, *PROVISIONED)], [first])
    assert p.delete == ["up-1"] and [n for _, n, _ in p.create] == [1]
    gone = plan([], [request("gang", 0, *PROVISIONED)], [first])
    assert gone.delete == ["up-1"] and gone.create == []


def test_a_provisioned_scale_up_releases_its_pods_and_goes_once_they_have() -> None:
    up = request("up-1", 2, *PROVISIONED, tpl="t-gpu-s", scale_up=True)
    p = plan([released("a", "gang"), gated("b"), gated("c")], [request("gang", 1, *PROVISIONED)], [up])
    assert released_into(p) == [("b", "up-1"), ("c", "up-1")] and p.delete == []
    after = plan([released("a", "gang")], [request("gang", 1, *PROVISIONED)], [up])
    assert after.delete == ["up-1"]  # scaled down: its pods are gone


def test_a_failed_scale_up_is_replaced() -> None:
    failed = request("up-1", 1, ("Failed", "True"), tpl="t-gpu-s", scale_up=True)
    p = plan([gated("b")], [request("gang", 0, *PROVISIONED)], [failed])
    assert p.delete == ["up-1"] and [n for _, n, _ in p.create] == [1]


def test_limits_bound_what_a_scale_up_asks() -> None:
    p = plan([gated(f"p{i}") for i in range(5)], [request("gang", 0, *PROVISIONED)], room=3, most=2)
    assert [n for _, n, _ in p.create] == [2]
    assert p.refused and "5 pods of pod set gpu" in p.refused[0]
    full = plan([gated("p")], [request("gang", 0, *PROVISIONED)], room=0)
    assert full.create == [] and full.waiting == {("gpu", GPU_DIGEST): 1}


def test_an_edit_of_where_pods_go_books_nothing_for_pods_that_exist() -> None:
    """KubeRay keeps the pods made from the older template: a placement edit asks for no booking of its own."""
    pods = [released("a", "gang")]
    for _ in range(6):
        p = gating.plan(pods, [request("gang", 1, *PROVISIONED)], [], TEMPLATES,
                        desired={("gpu", "d-edited"): 1}, room=100, most_per_request=100)
        assert p.create == [] and p.waiting == {}


def test_pods_still_to_come_are_booked_with_the_placement_the_spec_has_now() -> None:
    p = gating.plan([released("a", "gang")], [request("gang", 1, *PROVISIONED)], [], TEMPLATES,
                    desired={("gpu", "d-edited"): 3}, room=100, most_per_request=100)
    assert [(key, n) for key, n, _ in p.create] == [(("gpu", "d-edited"), 2)]  # exactly the 2 pods to come


def test_scale_up_requests_waiting_for_the_autoscaler_are_capped() -> None:
    first = request("up-1", 1, ("Accepted", "True"), tpl="t-gpu-s", scale_up=True)
    pods = [released("a", "gang"), gated("b"), gated("c", digest="d-other")]
    capped = plan_with(pods, [first], most_pending=1)
    assert capped.create == [] and capped.waiting == {("gpu", GPU_DIGEST): 1, ("gpu", "d-other"): 1}
    assert any("limits.maxPendingScaleUps" in r for r in capped.refused)
    assert [(key, n) for key, n, _ in plan_with(pods, [first], most_pending=2).create] == [(("gpu", "d-other"), 1)]


def test_a_pod_whose_requests_cannot_be_read_stays_gated_and_the_rest_go_on() -> None:
    bad = Pod("bad", "2030-01-01T00:00:00Z", "gpu", gated=True, runs=True, consumes=None, obj={"metadata": {}},
              unreadable="memory: 100E is out of range")
    p = plan([bad, gated("b")], [request("gang", 1, *PROVISIONED)])
    assert released_into(p) == [("b", "gang")] and p.create == []
    assert any("pod bad stays gated" in r and "100E" in r for r in p.refused)


def plan_with(pods: list[Pod], scale_ups: list[dict[str, Any]], most_pending: int) -> gating.GatePlan:
    return gating.plan(pods, [request("gang", 1, *PROVISIONED)], scale_ups,
                       [*TEMPLATES, template("t-other", digest="d-other")], room=100, most_per_request=100,
                       most_pending=most_pending)


def test_a_booking_every_pod_of_which_runs_bound_has_done_its_work() -> None:
    bound = [Pod(n, "2030-01-01T00:00:00Z", "gpu", gated=False, runs=True, consumes="gang", bound=True)
             for n in ("a", "b")]
    assert plan(bound, [request("gang", 2, *PROVISIONED)]).consumed == ["gang"]
    one_pending = [bound[0], Pod("b", "2030-01-01T00:00:00Z", "gpu", gated=False, runs=True, consumes="gang")]
    assert plan(one_pending, [request("gang", 2, *PROVISIONED)]).consumed == []  # b still needs its booking
    done = request("gang", 2, *PROVISIONED, ("BookingExpired", "True"))
    assert plan(bound, [done]).consumed == []  # marked once


def test_the_autoscalers_words_tell_never_from_not_now() -> None:
    from raygate.core import booking

    assert booking.request_of_simulated_pod("toobig-529712ff-a1-0-0") == "toobig-529712ff-a1"
    assert booking.request_of_simulated_pod("train-abc-a1r2-1-12") == "train-abc-a1r2"
    assert booking.request_of_simulated_pod("plain") is None
    assert booking.never_fits("pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu")
    assert booking.never_fits("pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector")
    assert not booking.never_fits("pod didn't trigger scale-up: 1 max node group size reached")
    assert not booking.never_fits("pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu, 1 max node group "
                                  "size reached")  # one group is only full: it may fit later
    assert not booking.never_fits("something else")


# --- a pod set's pods go together ---------------------------------------------------------------------------

def gathered(pods: list[Pod], desired: int, now: str, requests: list[dict[str, Any]] | None = None
             ) -> gating.GatePlan:
    at = parse_time(now)
    assert at is not None
    return gating.plan(pods, requests or [request("gang", 4, *PROVISIONED)], [], TEMPLATES,
                       desired={("gpu", GPU_DIGEST): desired}, room=100, most_per_request=100, now=at)


def test_a_gangs_pods_wait_for_the_rest_of_it_then_go_together() -> None:
    first = [gated("a"), gated("b"), gated("c")]
    waiting = gathered(first, 4, "2030-01-01T00:00:02Z")
    assert waiting.release == []
    assert waiting.gathering == gating.GATHER_SECONDS - 1  # the newest came a second ago
    assert waiting.create == []  # their slots stay theirs: nothing is booked twice
    everyone = gathered([*first, gated("d")], 4, "2030-01-01T00:00:02Z")
    assert sorted(released_into(everyone)) == [(n, "gang") for n in "abcd"]
    assert everyone.gathering is None


def test_pods_that_the_rest_never_joins_go_after_the_wait() -> None:
    late = gathered([gated("a"), gated("b")], 4, "2030-01-01T00:00:06Z")  # 5 s after the newest
    assert sorted(released_into(late)) == [("a", "gang"), ("b", "gang")]
    assert late.gathering is None


def test_a_pod_set_that_has_every_pod_or_no_spec_count_goes_at_once() -> None:
    running = [released("a", "gang"), released("b", "gang"), released("c", "gang")]
    replaced = gathered([*running, gated("d")], 4, "2030-01-01T00:00:01Z")  # a pod made again
    assert released_into(replaced) == [("d", "gang")]
    unknown = gating.plan([gated("a")], [request("gang", 4, *PROVISIONED)], [], TEMPLATES, room=100,
                          most_per_request=100, now=parse_time("2030-01-01T00:00:01Z"))
    assert released_into(unknown) == [("a", "gang")]
