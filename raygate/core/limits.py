"""What one Ray object may ask of the shared cluster (NamespacePolicy.limits and maxGang), checked at
create, on every update, and again by the reconciler before it asks the cluster-autoscaler for anything.

A single object must not be able to take the cluster down: a group with replicas or maxReplicas near
2**31 once made raygate ask the autoscaler for that many pods, and the autoscaler and the KubeRay
operator each grew past 10 GiB. So what is counted is the most the object can ever run: every
group at its ceiling (maxReplicas x numOfHosts under in-tree autoscaling, where the Ray autoscaler
may grow it without an edit), not the pods it starts with.
"""

from __future__ import annotations

from decimal import Decimal

from raygate.core import quantity as q
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang

_SHOWN = 3  # pod sets named in a message, largest first


def _largest(gang: Gang) -> str:
    sets = sorted(gang.pod_sets, key=lambda p: p.ceiling, reverse=True)[:_SHOWN]
    return ", ".join(f"{p.name} {p.ceiling:,}" for p in sets if p.ceiling > 0)


def request_pods(gang: Gang, policy: NamespacePolicy) -> int:
    """Pods the job's ProvisioningRequest books at start (its pod sets that request managed resources)."""
    return sum(p.count for p in gang.managed_pod_sets(policy.manages))


def problems(namespace: str, policy: NamespacePolicy, gang: Gang, *, books: bool) -> list[str]:
    """Each limit the object is over, with the numbers and what to change; [] when it fits. `books`: its capacity
    is booked (maxRequestPods applies)."""
    out = []
    limits = policy.limits
    if gang.ceiling_pods > limits.max_pods:
        out.append(f"it can run up to {gang.ceiling_pods:,} pods ({_largest(gang)}), but namespace {namespace} "
                   f"allows at most {limits.max_pods:,} per object (limits.maxPods in raygate-config): lower "
                   "replicas, or maxReplicas of groups with in-tree autoscaling")
    if books and (pods := request_pods(gang, policy)) > limits.max_request_pods:
        out.append(f"its ProvisioningRequest would book {pods:,} pods, but namespace {namespace} allows at most "
                   f"{limits.max_request_pods:,} per request (limits.maxRequestPods in raygate-config): lower the "
                   f"replicas of the groups that request {policy.managed_names()}")
    if policy.max_gang:
        most = gang.ceiling_resources
        for name, limit in sorted(policy.max_gang_quantities().items()):
            need = most.get(name, Decimal(0))
            if need > limit:
                binary = q.is_binary(name)
                out.append(f"it can use up to {q.format_quantity(need, binary=binary)} {name} with every group at "
                           f"its most, but namespace {namespace} allows at most "
                           f"{q.format_quantity(limit, binary=binary)} (maxGang in raygate-config): reduce "
                           "replicas, maxReplicas or per-pod requests")
    return out


def grows(old: Gang, new: Gang) -> bool:
    """Whether `new` can run more than `old`: more pods, or more of any resource, at its most."""
    if new.ceiling_pods > old.ceiling_pods:
        return True
    before = old.ceiling_resources
    return any(v > before.get(k, Decimal(0)) for k, v in new.ceiling_resources.items())
