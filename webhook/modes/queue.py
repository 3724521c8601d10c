"""Queue and priority labels, shared by the kueue and volcano modes."""

from __future__ import annotations

from raygate.policy import NamespacePolicy
from raygate.workload import Workload
from webhook.patch import PatchBuilder


def chosen(w: Workload, policy: NamespacePolicy, label: str, configured: str | None) -> str | None:
    """A user-set label is kept only where the config allows it; otherwise the config decides."""
    user = w.labels.get(label)
    if user and policy.allow_user_queue:
        return user
    return configured


def apply_labels(
    b: PatchBuilder, w: Workload, policy: NamespacePolicy, *, queue_label: str, priority_label: str,
    default_queue: str | None,
) -> str | None:
    """Write the queue and priority labels; return the queue (None when there is none to use)."""
    queue = chosen(w, policy, queue_label, policy.queue_name) or default_queue
    if queue:
        b.set(("metadata", "labels", queue_label), queue)
    priority = chosen(w, policy, priority_label, policy.priority_class)
    if priority:
        b.set(("metadata", "labels", priority_label), priority)
    return queue
