"""Prometheus metrics of the webhook, shared across gunicorn worker processes when there are several.

With several workers, prometheus_client's multiprocess mode aggregates their values, so any worker answering
/metrics reports the whole server. The directory must be set before prometheus_client is imported
(the server does that in the gunicorn master).
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from raygate.core import keys

REVIEWS = Counter(
    "raygate_webhook_reviews_total",
    "AdmissionReviews answered, by endpoint, kind, mode and outcome.",
    ["endpoint", "kind", "mode", "outcome"],
)
LATENCY = Histogram(
    "raygate_webhook_review_seconds",
    "Time to answer one AdmissionReview, from body received to response built.",
    ["endpoint"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
IN_FLIGHT = Gauge(
    "raygate_webhook_reviews_in_flight", "AdmissionReviews being answered now.", multiprocess_mode="livesum"
)
BAD_REQUESTS = Counter("raygate_webhook_bad_requests_total", "Bodies that were not AdmissionReviews (HTTP 400).")
CONFIG_REJECTED = Counter(
    "raygate_config_rejected_total", "ConfigMap versions rejected as invalid (counted by each worker)."
)
CONFIG_VALID = Gauge(
    "raygate_config_valid", "1 when the newest ConfigMap version is in force, 0 when it was rejected.",
    multiprocess_mode="min",
)


# Label values come from a fixed set, whatever a client sends: a series per made-up kind would
# grow /metrics (and each worker's memory) without bound.
KINDS = frozenset({keys.RAYJOB_KIND, keys.RAYCLUSTER_KIND, "Pod", "Job"})  # what the webhooks are sent


def kind_label(kind: str) -> str:
    return kind if kind in KINDS else "other"


def exposition() -> tuple[bytes, str]:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


class ReviewCounters:
    """`REVIEWS` children of one endpoint, bound once per label set: `labels()` validates and locks
    on every call, and a review needs only a dict lookup."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._children: dict[tuple[str, str, str], Any] = {}

    def inc(self, kind: str, mode: str, outcome: str) -> None:
        key = (kind, mode, outcome)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = REVIEWS.labels(self.endpoint, kind, mode, outcome)
        child.inc()
