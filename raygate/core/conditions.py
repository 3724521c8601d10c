"""status.conditions of a Kubernetes object, read by type (the reconciler, the demo and tests share it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raygate.core.objects import get


@dataclass(frozen=True)
class Condition:
    status: str
    reason: str
    message: str
    last_transition: str = ""  # RFC 3339, as written (the cluster-autoscaler rewrites it at every answer)

    @property
    def true(self) -> bool:
        return self.status == "True"


def raw_conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """status.conditions by type, as written (malformed entries skipped)."""
    return {str(c["type"]): c for c in get(obj, ("status", "conditions")) or []
            if isinstance(c, Mapping) and c.get("type")}


def conditions(obj: Mapping[str, Any]) -> dict[str, Condition]:
    return {t: Condition(str(c.get("status", "")), str(c.get("reason") or ""), str(c.get("message") or ""),
                         str(c.get("lastTransitionTime") or "")) for t, c in raw_conditions(obj).items()}
