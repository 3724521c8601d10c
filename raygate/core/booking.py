"""What one ProvisioningRequest can book for a job, the rules shared by every mode that books, and what a
request's conditions say together.

(Whether an object's capacity is booked at all is its rules' `books`, raygate.core.modes.for_object; how
the request is built is the reconciler's, reconciler/children.py.)
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from raygate.core import dra, keys
from raygate.core.conditions import conditions
from raygate.core.objects import get
from raygate.core.patch import PatchOp
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, PodSet

AUTOSCALER_DRA_ISSUE = "kubernetes/autoscaler#10065"

# A request's condition types, as the cluster-autoscaler sets them.
ACCEPTED = "Accepted"
PROVISIONED = "Provisioned"
FAILED = "Failed"
BOOKING_EXPIRED = "BookingExpired"
CAPACITY_REVOKED = "CapacityRevoked"  # GKE sets it; the open-source autoscaler never does
ENDED = (FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED)
"""Any of these True: the request will never provision, or book, as it is."""


def _any_true(request: Mapping[str, Any], types: tuple[str, ...]) -> bool:
    found = conditions(request)
    return any(t in found and found[t].true for t in types)


def provisioned(request: Mapping[str, Any]) -> bool:
    """Its capacity is booked: Accepted and Provisioned both True."""
    found = conditions(request)
    return all(t in found and found[t].true for t in (ACCEPTED, PROVISIONED))


def ended(request: Mapping[str, Any]) -> bool:
    """It will never provision as it is: it failed, or its booking expired or was revoked."""
    return _any_true(request, ENDED)


def booking_done(request: Mapping[str, Any]) -> bool:
    """Its booking ended: expired, or marked consumed (by raygate, or a newer autoscaler)."""
    return _any_true(request, (BOOKING_EXPIRED,))


def settled(request: Mapping[str, Any]) -> bool:
    """It asks for one patch of its job (admit, retry or give up): Provisioned, or ended."""
    return _any_true(request, (PROVISIONED, *ENDED))


def too_many_pod_sets(managed: Sequence[PodSet], policy: NamespacePolicy) -> str | None:
    """The one ProvisioningRequest a job gets has room for a limited number of pod sets."""
    if len(managed) <= keys.PROVREQ_MAX_POD_SETS:
        return None
    names = ", ".join(sorted({r for p in managed for r in p.managed(policy.manages)}))
    return (f"{len(managed)} pod sets request {names}, but one ProvisioningRequest books at most "
            f"{keys.PROVREQ_MAX_POD_SETS}: merge worker groups")


def claimed_devices(gang: Gang, policy: NamespacePolicy) -> list[str]:
    """Pod sets whose GPUs come through DRA claims (or might: claims raygate could not count). The
    cluster-autoscaler cannot yet simulate ResourceClaimTemplates in a ProvisioningRequest, so a booking
    would not cover those devices: where raygate books, such a job is refused rather than admitted on a
    booking that does not hold its GPUs."""
    out = []
    for p in gang.pod_sets:
        devices = {r: v for r, v in p.managed(policy.manages).items() if dra.is_device_resource(r)}
        what = [f"{v} {r.removeprefix(keys.DRA_RESOURCE_PREFIX)} per pod" for r, v in sorted(devices.items())]
        if what or p.uncounted:
            out.append(f"pod set {p.name} claims devices through DRA ({'; '.join([*what, *p.uncounted])})")
    if not out:
        return []
    return [f"{'; '.join(out)}. raygate books capacity with ProvisioningRequests, and the cluster-autoscaler cannot "
            f"yet simulate DRA claims in one ({AUTOSCALER_DRA_ISSUE}), so the booking would not cover these GPUs: "
            "request GPUs in container resources (e.g. nvidia.com/gpu), or ask your cluster admin for a namespace "
            "that does not book capacity (provisioning.enabled: false)"]


def refusals(policy: NamespacePolicy, gang: Gang) -> list[str]:
    """What keeps a job's pod sets from fitting into one ProvisioningRequest (asked where its capacity is booked)."""
    out = claimed_devices(gang, policy)
    problem = too_many_pod_sets(gang.managed_pod_sets(policy.manages), policy)
    return [*out, problem] if problem else out


CONSUMED_REASON = "CapacityBookingConsumed"


def consumed_ops(request: Mapping[str, Any], now: dt.datetime) -> list[PatchOp]:
    """The status patch that ends a request's booking once every pod it booked runs bound to a node: condition
    BookingExpired with the reason newer cluster-autoscalers write for it (kubernetes/autoscaler#9806). It tests
    the conditions as read, so a concurrent write by the autoscaler makes it fail rather than be overwritten."""
    found = get(request, ("status", "conditions"))
    current = found if isinstance(found, list) else []
    condition = {"type": BOOKING_EXPIRED, "status": "True", "reason": CONSUMED_REASON,
                 "message": "every pod this request booked runs bound to a node (raygate)",
                 "lastTransitionTime": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return [{"op": "test", "path": "/status/conditions", "value": current},
            {"op": "add", "path": "/status/conditions/-", "value": condition}]


# --- the cluster-autoscaler's words on a request it cannot provision ------------------------------------------

# The best-effort-atomic class simulates a request's pods as pods named `<request>-<pod set index>-<i>`, and when
# no node group can be scaled up for one it records an Event on it (reason NotTriggerScaleUp, from
# cluster-autoscaler) saying why, per node group: "pod didn't trigger scale-up: 1 max node group size reached,
# 2 node(s) didn't match Pod's node affinity/selector". (check-capacity records none.)
NOT_TRIGGERED_REASON = "NotTriggerScaleUp"
# Why a node group was not scaled up that can change without anyone touching the job: capacity in use, a
# backoff, a cluster-wide limit. Every other reason is the node group's template refusing the pod (too small,
# the wrong labels, a taint), which only a change of the node groups or of the job can change.
NOT_NOW = ("max node group size reached", "in backoff after failed scale-up", "not ready for scale-up",
           "max cluster", "max total nodes", "all-or-nothing", "not safe to scale up")
_FAKE_POD = re.compile(r"^(?P<request>.+)-\d+-\d+$")


def request_of_simulated_pod(pod_name: str) -> str | None:
    """The request a pod the cluster-autoscaler simulated for it is named after."""
    found = _FAKE_POD.match(pod_name)
    return found.group("request") if found else None


def never_fits(message: str) -> bool:
    """The autoscaler's NotTriggerScaleUp message says no node group could ever hold the pod (as the node groups
    are): every node group it names refused the pod's shape, none is only full, backing off or limited."""
    said = message.partition(":")[2].strip()
    return bool(said) and not any(marker in said for marker in NOT_NOW)
