"""Devices a pod claims through DRA (resource.k8s.io/v1), counted per DeviceClass.

A pod template names its claims in `spec.resourceClaims`: each either makes one claim per pod from a
ResourceClaimTemplate (what a gang of GPU pods uses), or shares one existing ResourceClaim with every
other pod that names it. The devices are not in any container's resources, so they are counted from
the template: `exactly.count` (1 when absent) per request, the largest alternative of
`firstAvailable`. A request for `All` devices of a class, a shared claim, or a template raygate
cannot see is not countable; the pod set says so (`uncounted`), and whoever needs the count refuses
rather than guess.

Counts land in the pod's resources as `resource.k8s.io/<DeviceClass>` (keys.DRA_RESOURCE_PREFIX).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from raygate.core import keys
from raygate.core import quantity as q
from raygate.core.objects import get, metadata

ClaimTemplates = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) -> the ResourceClaimTemplate as cached, or None when raygate has not seen it."""


def no_templates(namespace: str, name: str) -> None:
    return None


def template_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a cache keeps of a ResourceClaimTemplate: its name and spec (all that counting reads)."""
    meta = metadata(obj)
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")}, "spec": obj.get("spec")}


def device_resource(device_class: str) -> str:
    return keys.DRA_RESOURCE_PREFIX + device_class


def is_device_resource(resource: str) -> bool:
    return resource.startswith(keys.DRA_RESOURCE_PREFIX)


def _count(request: Mapping[str, Any]) -> int | None:
    """Devices one exact request asks for; None for allocationMode All (as many as a node has)."""
    if request.get("allocationMode") == "All":
        return None
    count = request.get("count", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def template_devices(template: Mapping[str, Any], name: str) -> tuple[q.Resources, list[str]]:
    """Devices per DeviceClass one claim made from `template` asks for, and what could not be counted."""
    devices: q.Resources = {}
    uncounted: list[str] = []
    requests = get(template, ("spec", "spec", "devices", "requests"))
    for r in requests if isinstance(requests, list) else []:
        if not isinstance(r, Mapping):
            continue
        exact = r.get("exactly")
        options = [exact] if isinstance(exact, Mapping) else [o for o in r.get("firstAvailable") or []
                                                              if isinstance(o, Mapping)]
        worst: q.Resources = {}  # firstAvailable: any one alternative may be the one allocated
        for option in options:
            device_class, count = option.get("deviceClassName"), _count(option)
            if not isinstance(device_class, str) or not device_class:
                continue
            if count is None:
                uncounted.append(f"ResourceClaimTemplate {name} asks for all devices of class {device_class} "
                                 "(allocationMode All)")
                continue
            worst = q.maximum(worst, {device_resource(device_class): Decimal(count)})
        devices = q.add(devices, worst)
    return devices, uncounted


def pod_devices(pod_template: Mapping[str, Any], where: str, namespace: str,
                templates: ClaimTemplates) -> tuple[q.Resources, list[str]]:
    """Devices one pod from `pod_template` claims, per DeviceClass, and the claims that could not be counted
    (each naming the field at `where`)."""
    claims = get(pod_template, ("spec", "resourceClaims"))
    devices: q.Resources = {}
    uncounted: list[str] = []
    for i, claim in enumerate(claims if isinstance(claims, list) else []):
        if not isinstance(claim, Mapping):
            continue
        field = f"{where}.spec.resourceClaims[{i}]"
        template_name = claim.get("resourceClaimTemplateName")
        if isinstance(template_name, str) and template_name:
            template = templates(namespace, template_name)
            if template is None:
                uncounted.append(f"{field} names ResourceClaimTemplate {template_name}, which raygate has not "
                                 "seen: create it before the job")
                continue
            found, missed = template_devices(template, template_name)
            devices = q.add(devices, found)
            uncounted += [f"{field}: {m}" for m in missed]
        elif claim.get("resourceClaimName"):
            uncounted.append(f"{field} shares ResourceClaim {claim['resourceClaimName']} with every pod that names "
                             "it, so its devices are not one pod's")
    return devices, uncounted
