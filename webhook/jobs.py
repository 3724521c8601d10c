"""The admission decision for batch Jobs: stamp, once, the Ray owner of a Job's pods into its pod template.

KubeRay makes batch Jobs of its own for Ray objects (a RayJob's submitter in K8sJobMode, a cluster's cleanup
Job), and the Job controller makes their pods, so the pod webhook cannot tell from who creates such a pod
which Ray object it serves. The Job's creator can be told: when KubeRay's operator creates a Job for a Ray
object, its pod template gets raygate's record of that object; any other Job's gets "none"
(raygate.core.identity). The Job controller copies the record into every pod, where the pod webhook reads it.
Pure, like the other decisions.
"""

from __future__ import annotations

from raygate.core import identity, keys, podgate
from raygate.core.modes import for_object
from raygate.core.objects import controller_ref, get
from raygate.core.patch import PatchBuilder
from raygate.webhook.review import Review
from raygate.webhook.verdict import Decision, allow, refuse

JOB_KIND = "Job"
STAMP = ("spec", "template", "metadata", "annotations", keys.RAY_OWNER_ANNOTATION)


def _subject(review: Review) -> dict[str, object] | str:
    job = review.obj
    if job is None:
        return "skipped-operation"
    if not review.opted_in(review.namespace_of(job)):
        return "skipped-namespace"
    return job


def mutate(review: Review) -> Decision:
    if review.operation != "CREATE":
        return allow("skipped-operation")
    job = _subject(review)
    if isinstance(job, str):
        return allow(job)
    user, config = review.user, review.config
    record = identity.job_template_record(job, user, config.ray_operator_users)
    owner = identity.ray_ref(controller_ref(job))
    namespace = review.namespace_of(job)
    policy = config.policy_for(namespace)
    template = get(job, ("spec", "template"))
    if owner is not None and record == identity.NO_RAY_OWNER and for_object(policy).gates_pods and isinstance(
            template, dict) and podgate.needs_gate(template, policy, review.claims, namespace):
        return refuse(f"this Job's pods ask for {policy.managed_names()} and it claims to be {owner.kind} "
                      f"{owner.name}'s (a controller reference), but {user or 'an unknown user'} is not KubeRay's "
                      "operator: only KubeRay makes a Ray object's Jobs, and raygate books GPUs only for them. "
                      "Leave the owner reference out, or let the RayJob run its own submitter", code=403)
    b = PatchBuilder(job)
    b.set(STAMP, record)
    return Decision(allowed=True, outcome="stamped" if b.ops else "unchanged", patch=b.ops)


def validate(review: Review) -> Decision:
    job = _subject(review)
    if isinstance(job, str):
        return allow(job)
    user, config = review.user, review.config
    if review.operation == "CREATE":
        if get(job, STAMP) != identity.job_template_record(job, user, config.ray_operator_users):
            return refuse(f"this Job's pod template would be stored without raygate's record "
                          f"{keys.RAY_OWNER_ANNOTATION} as raygate wrote it: another mutating webhook changed it, or "
                          "raygate's did not run (cluster admins: check `kubectl get mutatingwebhookconfiguration "
                          "raygate-mutating`)")
        return allow("valid")
    old = review.old
    if review.operation != "UPDATE" or old is None or user in config.trusted_users:
        return allow("skipped-operation" if user not in config.trusted_users else "trusted")
    if get(old, STAMP) != get(job, STAMP):
        return refuse(f"annotation {keys.RAY_OWNER_ANNOTATION} of this Job's pod template is raygate's record of "
                      "the Ray object its pods serve, written when the Job was created: leave it as it is",
                      code=403)
    return allow("valid")
