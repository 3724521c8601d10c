"""Queue and priority labels, shared by the kueue and volcano modes (not a mode itself)."""

from __future__ import annotations

from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Workload


def chosen(w: Workload, policy: NamespacePolicy, label: str, configured: str | None) -> str | None:
    """A user-set label is kept only where the config allows it; otherwise the config decides."""
    user = w.labels.get(label)
    if user and policy.allow_user_queue:
        return user
    return configured


def _write(b: PatchBuilder, w: Workload, label: str, value: str | None) -> None:
    if value:
        b.set(("metadata", "labels", label), value)
    elif label in w.labels:
        # A label the config does not allow and does not replace must go, or the user would pick
        # their own queue or priority after all.
        b.remove(("metadata", "labels", label))


def apply_labels(
    b: PatchBuilder, w: Workload, policy: NamespacePolicy, *, queue_label: str, priority_label: str,
    default_queue: str | None,
) -> str | None:
    """Write the queue and priority labels; return the queue (None when there is none to use)."""
    queue = chosen(w, policy, queue_label, policy.queue_name) or default_queue
    _write(b, w, queue_label, queue)
    _write(b, w, priority_label, chosen(w, policy, priority_label, policy.priority_class))
    return queue
