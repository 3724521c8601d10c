"""The interface every mode implements, and the types the modes share with their callers.

A mode is one class (one module each, as KubeRay keeps one file per batch scheduler) behind
`ModeRules`: what the webhook adds to a job it admits, what it refuses, and whether raygate holds
the job or another system admits it. A mode that schedules each gang through group objects the
reconciler creates (Volcano's PodGroup; Kubernetes' own Workload and PodGroup) also implements the
optional `GroupRules`, and of its capabilities those it has, as Kueue's job integrations add theirs
through small JobWith* interfaces. Callers ask the registry (`raygate.core.modes.for_object`) for an
object's rules and never branch on a mode's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from raygate.core.api import Resource, Served
from raygate.core.keys import ChildKind, Mode
from raygate.core.objects import JSON
from raygate.core.patch import PatchBuilder, PatchOp
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, Workload


class ModeRules(ABC):
    """What one mode means; the members with a body are optional (their default is "nothing")."""

    mode: ClassVar[Mode]
    admitted_by: ClassVar[str] = "raygate"
    """Who admits (unsuspends) jobs in this mode, as users know it."""
    holds: ClassVar[bool] = True
    """raygate suspends the job until it admits it. False: another system admits the job and owns
    spec.suspend; raygate only labels and validates it."""
    provisions_by_default: ClassVar[bool] = False
    """Whether ProvisioningRequests are on when the namespace's config does not say."""
    decided_labels: ClassVar[frozenset[str]] = frozenset()
    """Labels this mode decides on (queue, priority); users may not change them on a gated job."""
    template_annotations: ClassVar[tuple[str, ...]] = ()
    """Pod-template annotations this mode writes; users may not change them on a gated job."""

    @abstractmethod
    def apply(self, b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
        """Add to the job being created what this mode needs (labels, hold, scheduler metadata)."""

    def config_problems(self, policy: NamespacePolicy) -> list[str]:
        """Why a namespace's policy cannot work in this mode, each saying what to change."""
        return []

    def cluster_problems(self, served: Served) -> list[str]:
        """Why this mode cannot work on a cluster that serves `served`, each saying what to change."""
        return []

    def refusals(self, w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
        """Why the job cannot be admitted in this mode, each saying what to change; [] when it can. (Where its
        capacity is booked, what one ProvisioningRequest cannot hold is refused too: raygate.core.booking.)"""
        return []

    def stored_problem(self, w: Workload, namespace: str) -> str | None:
        """Why the job, as it would be stored after every mutating webhook, must not be created."""
        return None

    def claims(self, labels: Mapping[str, str]) -> bool:
        """Whether the system that admits in this mode owns an object by its labels alone."""
        return False

    def held_changes(self, old: Workload, new: Workload) -> list[str]:
        """Edits a held job may not get in this mode (beyond the guard's own), phrased after "You may not"."""
        return []


@dataclass(frozen=True)
class GroupSpec:
    """The group object a held job gets (its name and spec), as the webhook recorded it."""

    name: str
    spec: JSON


@dataclass(frozen=True)
class Prerequisite:
    """An object the group needs before it can be created (Volcano: its Queue, which must be Open)."""

    resource: Resource
    name: str


class Members(Protocol):
    """The groups raygate made, as the pod webhook's cache holds them (no API call while answering)."""

    def exists(self, namespace: str, group: str) -> bool:
        """Whether a group object of that name exists (raygate made it; it may be going)."""
        ...

    def bound_cluster(self, namespace: str, group: str) -> str | None:
        """The Ray cluster whose gang the scheduler bound in that group, as the reconciler recorded it."""
        ...


class NoMembers:
    """Offline (`raygate explain`, tests): no group is known."""

    def exists(self, namespace: str, group: str) -> bool:
        return False

    def bound_cluster(self, namespace: str, group: str) -> str | None:
        return None


NO_MEMBERS = NoMembers()


class GroupRules(ABC):
    """Optional: a mode that schedules each gang through group objects the reconciler creates, owned by the
    job, before the job is unsuspended. What every such mode has; what only some have are the capabilities
    below, each a GroupRules of its own, as Kueue's job integrations add theirs through small JobWith*
    interfaces: a mode's class line names what it has (tests/unit/test_modes.py keeps the table)."""

    group_kinds: ClassVar[tuple[ChildKind, ...]]
    """The kinds of group object, in the order they are created."""
    named_at_creation: ClassVar[bool] = True
    """The job's pod templates name its group from creation on, so the group is kept while the job is stopped
    (failed, or released by `raygate release`: its pods still gang-schedule once KubeRay creates them). False:
    they name one per admission, so a stopped job's groups go."""

    @abstractmethod
    def resources(self, served: Served) -> dict[ChildKind, Resource]:
        """Where the group objects live in a cluster that serves `served`; {} where it serves none."""

    def kind_of(self, obj: Mapping[str, Any]) -> ChildKind:
        """Which of the group kinds an object (as listed, or as created) is."""
        return self.group_kinds[0]

    @abstractmethod
    def recorded(self, w: Workload) -> GroupSpec:
        """The group the job is scheduled with: as the webhook recorded it at creation, or as its spec says
        now (a mode whose groups follow the spec while the job is held). Raises ManifestError when it is
        missing or unusable."""

    @abstractmethod
    def group_objects(self, w: Workload, spec: GroupSpec, served: Served) -> list[tuple[ChildKind, JSON]]:
        """The objects to create, in order."""

    @abstractmethod
    def schedules(self, spec: GroupSpec) -> str:
        """Why a job admitted without a booking is safe to start (its Event and reason say it)."""

    @abstractmethod
    def admit(self, b: PatchBuilder, w: Workload, spec: GroupSpec) -> None:
        """What the patch that unsuspends the job writes for the group (pods must never exist without it)."""

    def describe(self, spec: GroupSpec, served: Served) -> str | None:
        """The group objects in a line, for `raygate explain`."""
        return None


class GroupsWithPrerequisite(GroupRules):
    """Group objects that need another object before they can be created (Volcano: its Queue, which must be
    Open); the reconciler reads it first."""

    prerequisite_reason: ClassVar[str]
    """The Event reason while the prerequisite holds a job."""

    @abstractmethod
    def prerequisite(self, spec: GroupSpec) -> Prerequisite:
        """What to read from the cluster before creating the group."""

    @abstractmethod
    def prerequisite_problem(self, spec: GroupSpec, found: Mapping[str, Any] | None) -> str | None:
        """Why the group cannot be created yet, given the prerequisite as found (None: it does not exist)."""


class GroupsWithDrift(GroupRules):
    """Group objects another writer may change after raygate made them (KubeRay's own Volcano integration
    rewrites a PodGroup of the name raygate uses): the reconciler finds the change and stops the job."""

    rewritten_reason: ClassVar[str]
    """The Event reason when another writer changed the group."""

    @abstractmethod
    def drift(self, spec: GroupSpec, actual: Mapping[str, Any]) -> list[str]:
        """How the group in the cluster differs from the recorded one, in the fields that decide the gang."""

    @abstractmethod
    def rewritten(self, spec: GroupSpec, changes: list[str]) -> str:
        """Why a job whose group another writer changed is stopped, and what to do about it."""


class GroupsAtThePod(GroupRules):
    """Groups each pod names itself at CREATE (Kubernetes' spec.schedulingGroup): the pod webhook writes the group
    into every pod, a scale-up's pods get groups of their own (increments), and the reconciler records on a
    group what the scheduler bound."""

    @abstractmethod
    def pod_patch(self, b: PatchBuilder, pod: Mapping[str, Any], namespace: str, gated: bool,
                  members: Members) -> None:
        """What the pod webhook writes into a pod being created (`gated`: raygate gates it, so it is released
        only against a booking); pure, from `members` (the webhook's cache)."""

    @abstractmethod
    def names_group(self, pod: Mapping[str, Any]) -> str | None:
        """The group a pod being created must join, as its template says (None: none of this mode's)."""

    @abstractmethod
    def pod_problem(self, pod: Mapping[str, Any]) -> str | None:
        """Why a pod, as it would be stored after every mutating webhook, must not be created."""

    @abstractmethod
    def increment_objects(self, w: Workload, name: str, pod_set: str, pods: int,
                          served: Served) -> list[tuple[ChildKind, JSON]]:
        """The group of `pods` pods of `pod_set` released together that name group `name`, which raygate has not
        made yet (a scale-up's increment)."""

    @abstractmethod
    def is_increment(self, obj: Mapping[str, Any]) -> bool:
        """Whether a group object is a scale-up's increment (it goes when its pods have)."""

    @abstractmethod
    def marks(self, obj: Mapping[str, Any], bound: Mapping[str, int]) -> list[PatchOp]:
        """What the reconciler records on a group object of an admitted job, given its bound pods per Ray
        cluster (JSON patch operations; [] when nothing changes)."""
