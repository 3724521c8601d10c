"""The Flask shell around the pure decision: routes, metrics and one log line per decision."""

from __future__ import annotations

import logging
import time

from flask import Flask, Response, request

from webhook import metrics
from webhook.decision import Decide, mutate, validate
from webhook.handler import answer
from webhook.review import kind_of, username
from webhook.state import WebhookState

log = logging.getLogger("raygate.webhook")
JSON_TYPE = "application/json"


def create_app(state: WebhookState) -> Flask:
    app = Flask("raygate-webhook")

    def review(endpoint: str, decide: Decide) -> Response:
        started = time.perf_counter()
        with metrics.IN_FLIGHT.track_inprogress():
            result = answer(request.get_data(), decide, state.config, state.namespace_labels)
        metrics.LATENCY.labels(endpoint).observe(time.perf_counter() - started)
        d, req = result.decision, result.request
        if d is None or req is None:
            metrics.BAD_REQUESTS.inc()
            return Response(result.body, status=result.status, mimetype=JSON_TYPE)
        kind = kind_of(req)
        metrics.REVIEWS.labels(endpoint, kind, d.mode.value if d.mode else "", d.outcome).inc()
        if d.outcome in {"mutated", "refused", "error"} or (endpoint == "validate" and not d.allowed):
            log.info(
                "admission",
                extra={"endpoint": endpoint, "operation": req.get("operation"), "kind": kind,
                       "namespace": req.get("namespace"), "object": req.get("name") or "",
                       "user": username(req), "allowed": d.allowed,
                       "outcome": d.outcome, "reason": d.message, "uid": req["uid"],
                       "dryRun": bool(req.get("dryRun"))},
            )
        return Response(result.body, status=result.status, mimetype=JSON_TYPE)

    @app.post("/mutate")
    def mutate_route() -> Response:
        return review("mutate", mutate)

    @app.post("/validate")
    def validate_route() -> Response:
        return review("validate", validate)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        missing = state.not_ready()
        if missing:
            return Response("not ready: waiting for " + ", ".join(missing), status=503, mimetype="text/plain")
        # The ConfigMap version in force lets tests and operators see that a reload landed.
        return Response("ok", mimetype="text/plain",
                        headers={"X-Raygate-Config-Version": state.config_source.seen_version})

    @app.get("/metrics")
    def metrics_route() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, content_type=content_type)

    return app
