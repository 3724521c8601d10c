"""What a held job books: the pod sets that go into its ProvisioningRequest and its mode's group object, read
from the job once per decision and checked against the namespace's limits. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from raygate.core import booking, limits
from raygate.core.modes import GroupSpec, ObjectRules
from raygate.core.workload import ManifestError, PodSet, Workload
from raygate.reconciler import children
from raygate.reconciler.children import BadInput


@dataclass(frozen=True)
class Needs:
    """What one held job needs: the pod sets that go into a request, and its mode's group object (built by
    its ObjectRules.group).

    (Not workload.Gang, the whole gang of a job: these are the parts of it raygate books.)"""

    managed: tuple[PodSet, ...]
    provision: bool
    group: GroupSpec | None
    fingerprint: str = ""  # of the managed pod sets: what a request for them books

    def request_name(self, w: Workload, attempt: int, rounds: int = 0) -> str:
        return children.request_name(w, attempt, self.fingerprint, rounds)


def needs_of(w: Workload, rules: ObjectRules) -> Needs:
    """Raises BadInput for a job that cannot be admitted as written."""
    policy = rules.policy
    try:
        gang = w.gang()
    except ManifestError as err:
        raise BadInput(f"raygate cannot read this {w.kind}: {err}") from None
    managed = tuple(gang.managed_pod_sets(policy.manages))
    try:
        group = rules.group.recorded(w) if rules.group is not None else None
    except ManifestError as err:
        raise BadInput(str(err)) from None
    # The webhook refused these at create and on update; checked again before anything is asked of the
    # autoscaler (a job held before a limit was lowered, or past a webhook that was down).
    problems = booking.refusals(policy, gang) if rules.books else []
    if problems := [*problems, *limits.problems(w.namespace, policy, gang, books=rules.books)]:
        raise BadInput("; ".join(problems))
    try:
        fingerprint = children.fingerprint(w, managed)
    except ManifestError as err:
        raise BadInput(f"raygate cannot read this {w.kind}: {err}") from None
    return Needs(managed, rules.books and bool(managed), group, fingerprint)
