"""`raygate release` (also `kubectl raygate release`): after raygate is uninstalled, release or delete
the RayJobs and RayClusters it still holds.

Removing raygate removes its webhooks and its reconciler, not its marks on jobs: a job it held
(state Pending or Provisioning) or gave up on (Failed) stays suspended with raygate's label and
annotations, and nothing will ever unsuspend it. Its children (PodTemplates, ProvisioningRequests,
PodGroups) stay too, until the job is deleted (they carry owner references).

Releasing a job unsuspends it and removes raygate's label and annotations, so it starts at once with
no capacity booked, as it would in a namespace raygate never managed; its ProvisioningRequests and
PodTemplates are deleted (nothing would consume the booking). `--delete` deletes the jobs and their
children instead. Pods still held by raygate's scheduling gate (raygate.io/capacity) have it lifted,
so they are scheduled as in a namespace raygate never managed. Without `--yes` nothing changes: the
command lists what it would do.

Safety: it refuses while raygate's webhook configurations are registered or a reconciler holds the
leader Lease (the reconciler would admit those jobs itself, and the webhook refuses a held job's
unsuspend). It never unsuspends a job Kueue owns (kueue mode, or a Kueue queue label): Kueue owns
spec.suspend there. A job that raygate admitted is running and is left alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from raygate.core import keys, podgate, podgate_policy
from raygate.core.errors import RaygateError
from raygate.core.keys import ChildKind
from raygate.core.modes import ObjectRules, admitted_elsewhere, for_object
from raygate.core.objects import controller_uid, meta_str, metadata, string_map
from raygate.core.policy import DEFAULT_CONFIG
from raygate.core.times import parse_time

if TYPE_CHECKING:
    from raygate.core.api import Resource
    from raygate.core.objects import JSON
    from raygate.kube.client import Kube

RELEASABLE_STATES = (keys.State.PENDING, keys.State.PROVISIONING, keys.State.FAILED)
# Jobs first, so a child is never deleted before the patch that releases its job succeeded.
CHILD_KINDS = tuple(ChildKind)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "release",
        help="after uninstalling raygate: release (unsuspend) or delete the jobs it still holds",
        description="After raygate is uninstalled, release the RayJobs and RayClusters it still holds "
        f"(label {keys.STATE_LABEL} Pending, Provisioning or Failed): unsuspend each, remove raygate's label "
        "and annotations, delete its ProvisioningRequests and PodTemplates; lift raygate's gate from pods it still "
        "gates. With --delete, delete the jobs and their children instead. Lists what it would do unless --yes is "
        "given. Refuses while raygate's webhooks are registered or its reconciler runs; never unsuspends a job Kueue "
        "owns. Also runs as `kubectl raygate release`.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-n", "--namespace", default=None, help="the namespace to release jobs in")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="release jobs in every namespace")
    p.add_argument("--delete", action="store_true",
                   help="delete the held jobs and their children instead of unsuspending them")
    p.add_argument("--yes", action="store_true", help="do it (without --yes: only list what would be done)")
    p.add_argument("--kubeconfig", default=None, metavar="PATH",
                   help="kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
    p.set_defaults(func=run)


# --- the plan: pure ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Child:
    kind: ChildKind
    namespace: str
    name: str
    owner_uid: str | None


@dataclass
class Item:
    """One held job and what happens to it."""

    kind: str
    namespace: str
    name: str
    uid: str
    state: str
    mode: str
    action: str  # release, delete, skip
    why: str = ""
    delete_children: list[Child] = field(default_factory=list)
    keep_children: list[Child] = field(default_factory=list)
    obj: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Plan:
    items: list[Item]
    orphans: list[Child]  # raygate's children whose job no longer exists
    gated: list[Mapping[str, Any]] = field(default_factory=list)  # pods raygate's gate still holds

    @property
    def acting(self) -> list[Item]:
        return [i for i in self.items if i.action != "skip"]


def child_of(kind: ChildKind, obj: Mapping[str, Any]) -> Child:
    found = metadata(obj)
    return Child(kind, str(found.get("namespace", "")), str(found.get("name", "")), controller_uid(obj))


def _skip_reason(rules: ObjectRules, labels: Mapping[str, str]) -> str | None:
    """Another system admits this job (its recorded mode, or that system's own labels): it owns spec.suspend."""
    other = rules.mode_rules if not rules.holds else admitted_elsewhere(labels)
    if other is not None:
        who = other.admitted_by
        return (f"{who} owns spec.suspend of this job ({other.mode.value} mode, or {who}'s own labels): {who} "
                "admits it, raygate's release never unsuspends it")
    return None


def plan(jobs: Iterable[tuple[str, Mapping[str, Any]]], children: Iterable[Child], *, delete: bool) -> Plan:
    """What releasing (or, with `delete`, deleting) does to `jobs` (every RayJob and RayCluster in scope,
    as (kind, object)) and to raygate's `children` there."""
    by_owner: dict[str, list[Child]] = {}
    for c in children:
        by_owner.setdefault(c.owner_uid or "", []).append(c)
    items: list[Item] = []
    uids: set[str] = set()
    for kind, obj in jobs:
        found = metadata(obj)
        uid = str(found.get("uid", ""))
        uids.add(uid)
        labels, annotations = string_map(found.get("labels")), string_map(found.get("annotations"))
        state = labels.get(keys.STATE_LABEL, "")
        if state not in RELEASABLE_STATES:
            continue  # never held, or Admitted and running: nothing of raygate's stops it
        mode = annotations.get(keys.MODE_ANNOTATION, "")
        mine = sorted(by_owner.get(uid, []), key=lambda c: (CHILD_KINDS.index(c.kind), c.name))
        item = Item(kind, str(found.get("namespace", "")), str(found.get("name", "")), uid, state, mode,
                    action="delete" if delete else "release", obj=obj)
        # raygate is uninstalled, its config with it: a job without a recorded mode is taken under the default
        # policy (provisioning: no group to keep).
        rules = for_object(DEFAULT_CONFIG.defaults, annotations)
        group = rules.group
        skip = _skip_reason(rules, labels)
        if skip:
            item.action, item.why = "skip", skip
        elif delete or group is None or not group.named_at_creation:
            item.delete_children = mine
        else:
            kind_of_group = group.group_kinds[0]
            groups = [c for c in mine if c.kind in group.group_kinds]
            if not groups:
                item.action = "skip"
                item.why = (f"{mode} mode, but its {kind_of_group} was never created: its pods name a "
                            f"{kind_of_group} that does not exist and would never schedule; delete it (--delete) "
                            "and create it again")
            else:
                # Its pods are scheduled through this group: keeping it keeps the gang.
                item.keep_children = groups
                item.delete_children = [c for c in mine if c.kind not in group.group_kinds]
        items.append(item)
    items.sort(key=lambda i: (i.namespace, i.kind, i.name))
    orphans = sorted((c for uid, cs in by_owner.items() if uid not in uids for c in cs),
                     key=lambda c: (c.namespace, CHILD_KINDS.index(c.kind), c.name))
    return Plan(items, orphans)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def job_release_ops(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch that unsuspends `obj` and removes raygate's label and annotations, applied only
    while the job is still the one listed in the state listed (uid and state label tested)."""
    found = metadata(obj)
    labels, annotations = string_map(found.get("labels")), string_map(found.get("annotations"))
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": found.get("uid")},
        {"op": "test", "path": f"/metadata/labels/{_escape(keys.STATE_LABEL)}",
         "value": labels.get(keys.STATE_LABEL)},
        {"op": "add", "path": "/spec/suspend", "value": False},
        {"op": "remove", "path": f"/metadata/labels/{_escape(keys.STATE_LABEL)}"},
    ]
    # raygate.io/... only: provreq.raygate.io/<Parameter> annotations are the user's own.
    ops += [{"op": "remove", "path": f"/metadata/annotations/{_escape(k)}"}
            for k in sorted(annotations) if k.startswith(f"{keys.DOMAIN}/")]
    return ops


def blockers(mutating: bool, validating: bool, lease: Mapping[str, Any] | None, now: dt.datetime, *,
             policy: bool = False) -> list[str]:
    """Why raygate still looks installed; empty when release may go ahead. (`policy`: the pod gate's policy is
    there, which gates KubeRay's GPU pods with nobody left to lift the gate.)"""
    out = [f"{kind} {name} is registered" for present, kind, name in (
        (mutating, "MutatingWebhookConfiguration", keys.MUTATING_WEBHOOK_CONFIG),
        (validating, "ValidatingWebhookConfiguration", keys.VALIDATING_WEBHOOK_CONFIG),
        (policy, "MutatingAdmissionPolicy", podgate_policy.POLICY_NAME)) if present]
    spec = (lease or {}).get("spec") or {}
    holder = spec.get("holderIdentity")
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    age = (now - renewed).total_seconds() if renewed else None
    if holder and age is not None and age < duration:
        # An uninstall deletes the reconciler's RBAC with its pod, so a stopping reconciler often
        # cannot release its Lease: it then lingers until it expires.
        out.append(f"reconciler {holder} holds Lease {keys.SYSTEM_NAMESPACE}/{keys.LEADER_LEASE} "
                   f"(renewed {age:.0f}s ago; if raygate was just uninstalled, it expires in "
                   f"{duration - age:.0f}s: run this again then)")
    return out


def render(p: Plan, out: TextIO) -> None:
    rows = [("NAMESPACE", "NAME", "STATE", "MODE", "ACTION", "CHILDREN")]
    for i in p.items:
        kids = [f"delete {c.kind}/{c.name}" for c in i.delete_children]
        kids += [f"keep {c.kind}/{c.name}" for c in i.keep_children]
        rows.append((i.namespace, f"{i.kind.lower()}/{i.name}", i.state, i.mode or "-", i.action,
                     ", ".join(kids) or "-"))
    widths = [max(len(r[n]) for r in rows) for n in range(len(rows[0]) - 1)]
    for r in rows:
        out.write("   ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip() + "\n")
    for i in p.items:
        if i.why:
            out.write(f"{i.namespace}/{i.kind.lower()}/{i.name}: skipped: {i.why}\n")
    for c in p.orphans:
        out.write(f"{c.namespace}/{c.kind}/{c.name}: its job is gone: delete\n")
    for pod in p.gated:
        out.write(f"{meta_str(pod, 'namespace')}/pod/{meta_str(pod, 'name')}: gated by raygate: lift the gate\n")


# --- against the cluster ----------------------------------------------------------------------

def child_resources(kube: Kube) -> dict[ChildKind, Resource]:
    from raygate.kube import discovery

    return discovery.child_resources(kube, discovery.served_provreq_version(kube))


def check_uninstalled(kube: Kube, now: dt.datetime | None = None) -> None:
    from raygate.core.api import LEASES, MUTATING_POLICIES, MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS
    from raygate.kube.client import ApiError

    def exists(res: Resource, name: str, namespace: str | None = None) -> JSON | None:
        try:
            return kube.get(res, name, namespace)
        except ApiError as err:
            if err.not_found:
                return None
            raise RaygateError(f"cannot read {res.kind} {name}: {err.status} {err.message}") from None

    found = blockers(exists(MUTATING_WEBHOOKS, keys.MUTATING_WEBHOOK_CONFIG) is not None,
                     exists(VALIDATING_WEBHOOKS, keys.VALIDATING_WEBHOOK_CONFIG) is not None,
                     exists(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE), now or dt.datetime.now(dt.UTC),
                     policy=exists(MUTATING_POLICIES, podgate_policy.POLICY_NAME) is not None)
    if found:
        raise RaygateError(
            "raygate is still installed (" + "; ".join(found) + "): its reconciler admits held jobs as their "
            "capacity comes, and its webhook refuses to unsuspend them. Uninstall raygate first (helm uninstall "
            f"raygate -n {keys.SYSTEM_NAMESPACE}, or kubectl delete -k config/default and -k config/pod-gate-policy). "
            "If raygate is gone and only its registrations were left behind, delete them: kubectl delete "
            f"mutatingwebhookconfiguration {keys.MUTATING_WEBHOOK_CONFIG}; kubectl delete "
            f"validatingwebhookconfiguration {keys.VALIDATING_WEBHOOK_CONFIG}; kubectl delete "
            f"mutatingadmissionpolicy,mutatingadmissionpolicybinding {podgate_policy.POLICY_NAME}"
        )


def collect(kube: Kube, namespace: str | None, *, delete: bool) -> tuple[Plan, dict[ChildKind, Resource]]:
    from raygate.core.api import PODS, RAYCLUSTERS, RAYJOBS
    from raygate.kube.client import ApiError

    kinds = child_resources(kube)
    try:
        jobs = [(res.kind, {"apiVersion": res.api_version, "kind": res.kind, **obj})
                for res in (RAYJOBS, RAYCLUSTERS) for obj in kube.list(res, namespace).get("items") or []]
        children = [child_of(kind, obj) for kind, res in kinds.items()
                    for obj in kube.list(res, namespace, labelSelector=keys.MANAGED_SELECTOR).get("items") or []]
        gated = [pod for pod in kube.list(PODS, namespace, labelSelector=f"{keys.POD_GATE_LABEL}={keys.POD_GATED}")
                 .get("items") or [] if podgate.gated(pod)]
    except ApiError as err:
        where = f"namespace {namespace}" if namespace else "all namespaces"
        raise RaygateError(f"listing jobs and raygate's objects in {where} failed: {err.status} {err.message}") \
            from None
    p = plan(jobs, children, delete=delete)
    p.gated = gated
    return p, kinds


def _delete_children(kube: Kube, kinds: Mapping[ChildKind, Resource], children: Sequence[Child], out: TextIO) -> None:
    for c in children:
        kube.delete(kinds[c.kind], c.name, c.namespace)
        out.write(f"  deleted {c.kind} {c.namespace}/{c.name}\n")


def execute(kube: Kube, p: Plan, kinds: Mapping[ChildKind, Resource], out: TextIO) -> int:
    """Carry out the plan; returns how many jobs could not be handled (each says why)."""
    from raygate.core.api import PODS, RAYCLUSTERS, RAYJOBS
    from raygate.kube import events
    from raygate.kube.client import JSON_PATCH, ApiError

    failed = 0
    for i in p.acting:
        res = RAYJOBS if i.kind == keys.RAYJOB_KIND else RAYCLUSTERS
        what = f"{i.kind.lower()}/{i.name} in {i.namespace}"
        try:
            if i.action == "delete":
                kube.delete(res, i.name, i.namespace)
                out.write(f"deleted {what}\n")
            else:
                kube.patch(res, i.name, job_release_ops(i.obj), i.namespace, content_type=JSON_PATCH)
                out.write(f"released {what}: unsuspended, raygate's label and annotations removed\n")
                events.record(kube, dict(i.obj), "Released",
                              f"released by `raygate release` after raygate was uninstalled (was {i.state}): "
                              "unsuspended without a capacity booking")
            _delete_children(kube, kinds, i.delete_children, out)
        except ApiError as err:
            failed += 1
            hint = " (it changed since it was listed: run the command again)" if err.status in (409, 422) else ""
            out.write(f"FAILED {what}: {err.status} {err.reason}: {err.message}{hint}\n")
    try:
        _delete_children(kube, kinds, p.orphans, out)
    except ApiError as err:
        failed += 1
        out.write(f"FAILED deleting raygate's leftover objects: {err.status} {err.message}\n")
    for pod in p.gated:
        what = f"pod/{meta_str(pod, 'name')} in {meta_str(pod, 'namespace')}"
        try:
            kube.patch(PODS, meta_str(pod, "name"), podgate.release_ops(pod, None, None), meta_str(pod, "namespace"),
                       content_type=JSON_PATCH)
            out.write(f"lifted raygate's gate from {what}: it is scheduled without a capacity booking\n")
        except ApiError as err:
            if err.status in (404, 422):  # gone, or its gate lifted since it was listed
                continue
            failed += 1
            out.write(f"FAILED {what}: {err.status} {err.reason}: {err.message}\n")
    return failed


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from raygate.kube.client import Kube

    out = out or sys.stdout
    kube = Kube.connect(args.kubeconfig, user_agent="raygate-release")
    check_uninstalled(kube)
    namespace = None if args.all_namespaces else args.namespace
    p, kinds = collect(kube, namespace, delete=args.delete)
    where = "in any namespace" if namespace is None else f"in namespace {namespace}"
    if not p.items and not p.orphans and not p.gated:
        out.write(f"No RayJob or RayCluster held by raygate {where}, and none of its objects or gated pods left.\n")
        return 0
    render(p, out)
    verb = "delete" if args.delete else "release"
    if not args.yes:
        leftovers = f" and delete {len(p.orphans)} leftover object(s)" if p.orphans else ""
        leftovers += f" and lift raygate's gate from {len(p.gated)} pod(s)" if p.gated else ""
        out.write(f"Dry run: nothing changed. Run again with --yes to {verb} {len(p.acting)} job(s){leftovers} "
                  f"{where}.\n")
        return 0
    failed = execute(kube, p, kinds, out)
    if failed:
        raise RaygateError(f"{failed} of them could not be handled (see above)")
    return 0
