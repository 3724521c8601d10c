"""Kubernetes Events (core/v1) on the objects raygate acts on: what users see in `kubectl describe`."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

from raygate.core.api import EVENTS
from raygate.core.objects import metadata
from raygate.core.times import timestamp
from raygate.kube.client import ApiError, Kube

log = logging.getLogger("raygate.events")
COMPONENT = "raygate"


def record(kube: Kube, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False,
           name: str | None = None) -> None:
    """Post one Event; `name` makes it idempotent (an existing Event of that name is kept).

    Failures are logged, never raised: an Event is a report, and losing one must not stop a flow.
    """
    found = metadata(obj)
    namespace = str(found.get("namespace") or "default")
    now = timestamp(dt.datetime.now(dt.UTC))
    event = {
        "metadata": {"name": name or f"{found.get('name', 'object')}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": found.get("name"),
            "namespace": namespace, "uid": found.get("uid"), "resourceVersion": found.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kube.create(EVENTS, event, namespace)
    except ApiError as err:
        if not err.already_exists:
            log.warning("could not record event", extra={"reason": reason, "error": str(err)})
