"""kueue mode: label the job for its LocalQueue and refuse what Kueue cannot run.

Kueue owns spec.suspend here, so raygate never touches it and never marks the job as held. Kueue's
own webhook suspends a job that carries its queue label, but only if the API server calls it after
raygate's; the validating webhook refuses a job that arrives unsuspended (`stored_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping

from raygate.core import keys, queue_labels
from raygate.core.keys import Mode
from raygate.core.modes.base import ModeRules
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, Workload


class Kueue(ModeRules):
    mode = Mode.KUEUE
    admitted_by = "Kueue"
    holds = False  # Kueue admits: raygate labels and validates, and never touches spec.suspend
    decided_labels = frozenset({keys.KUEUE_QUEUE_LABEL, keys.KUEUE_PRIORITY_LABEL})

    def config_problems(self, policy: NamespacePolicy) -> list[str]:
        if policy.provisioning.enabled:
            return ["kueue mode cannot use raygate's own ProvisioningRequests (provisioning.enabled: true); "
                    "configure Kueue's ProvisioningRequest admission check instead"]
        return []

    def refusals(self, w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
        out = []
        groups = w.worker_groups()
        if len(groups) > keys.KUEUE_MAX_WORKER_GROUPS:
            out.append(
                f"Kueue runs at most {keys.KUEUE_MAX_WORKER_GROUPS} worker groups and this has {len(groups)}: "
                "merge worker groups"
            )
        if any(g.get("groupName") == "head" for _, g in groups):
            out.append('a worker group is named "head", which Kueue reserves for the head pod: rename it')
        if w.autoscaling and w.annotations.get(keys.KUEUE_ELASTIC_ANNOTATION) != "true":
            out.append(
                "Kueue admits in-tree autoscaling only for elastic jobs: set enableInTreeAutoscaling: false, "
                f'or add annotation {keys.KUEUE_ELASTIC_ANNOTATION}: "true" if your Kueue enables elastic jobs'
            )
        if not queue_labels.chosen(w, policy, keys.KUEUE_QUEUE_LABEL, policy.queue_name):
            out.append(
                f"no Kueue LocalQueue for namespace {w.namespace}: "
                + (
                    f"add label {keys.KUEUE_QUEUE_LABEL}: <local queue>"
                    if policy.allow_user_queue
                    else "ask your cluster admin to set queueName for it in the raygate-config ConfigMap"
                )
            )
        return out

    def apply(self, b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
        queue_labels.apply_labels(
            b, w, policy, queue_label=keys.KUEUE_QUEUE_LABEL, priority_label=keys.KUEUE_PRIORITY_LABEL,
            default_queue=None,
        )

    def stored_problem(self, w: Workload, namespace: str) -> str | None:
        """Validation runs after every mutating webhook: an unsuspended object here would start at once.

        Kueue suspends a job carrying its queue label in its own mutating webhook, but the API server
        calls webhook configurations in name order, so Kueue's runs before raygate adds the label, and
        sees it only if it is re-invoked (its reinvocationPolicy, Never in Kueue's default install)."""
        if w.suspended:
            return None
        return (
            f"{w.kind} {w.name} would start at once: namespace {namespace} is in kueue mode, but nothing "
            "suspended it for Kueue to admit. Create it with `spec.suspend: true` (Kueue unsuspends it once "
            "admitted). Cluster admins: set reinvocationPolicy: IfNeeded on Kueue's mutating webhooks "
            "(Helm value mutatingWebhook.reinvocationPolicy), and check that Kueue manages "
            f"{w.kind.lower()}s (integrations.frameworks)"
        )

    def claims(self, labels: Mapping[str, str]) -> bool:
        return keys.KUEUE_QUEUE_LABEL in labels  # Kueue's webhook manages any job with its queue label


RULES = Kueue()
