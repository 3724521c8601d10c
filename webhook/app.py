"""The Flask shell around the pure decision: routes, metrics and a log line per decision.

Every route, `POST /mutate` and `/validate` included, is a plain Flask view. Flask's own work per
request (request and app contexts, URL matching, the Response) costs about as much CPU as the
decision once served (README, "Measured side by side"), so the two review views do no more than
they must: read the body once from the server's stream, answer with headers built once, and log
only what is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from flask import Flask, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from raygate.webhook import metrics
from raygate.webhook.decision import Decide, mutate, validate
from raygate.webhook.handler import answer
from raygate.webhook.limits import BodyLimits
from raygate.webhook.review import kind_of, username
from raygate.webhook.state import WebhookState

log = logging.getLogger("raygate.webhook")
JSON_TYPE = "application/json"


def _reviewer(state: WebhookState, endpoint: str, decide: Decide) -> Callable[[bytes], tuple[int, bytes]]:
    """Body in, (HTTP status, JSON body) out, with the metrics and the log line around the decision."""
    latency = metrics.LATENCY.labels(endpoint)
    reviews = metrics.ReviewCounters(endpoint)
    in_flight = metrics.IN_FLIGHT
    perf_counter = time.perf_counter

    def review(body: bytes) -> tuple[int, bytes]:
        started = perf_counter()
        in_flight.inc()
        try:
            result = answer(body, decide, state.config, state.namespace_labels)
        finally:
            in_flight.dec()
        latency.observe(perf_counter() - started)
        d, req = result.decision, result.request
        if d is None or req is None:
            metrics.BAD_REQUESTS.inc()
            return result.status, result.body
        kind = kind_of(req)
        reviews.inc(metrics.kind_label(kind), d.mode.value if d.mode else "", d.outcome)
        # A refusal is what someone comes asking about: info. Every other decision is at debug, as
        # routine per-request lines are in Kubernetes components: the object (state label, mode
        # annotation, Events) and the API server's audit log record each admission anyway, and at
        # full load this line cost about a tenth of the webhook's CPU.
        level = logging.INFO if not d.allowed else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(
                level, "admission",
                extra={"endpoint": endpoint, "operation": req.get("operation"), "kind": kind,
                       "namespace": req.get("namespace"), "object": req.get("name") or "",
                       "user": username(req), "allowed": d.allowed,
                       "outcome": d.outcome, "reason": d.message, "uid": req["uid"],
                       "dryRun": bool(req.get("dryRun"))},
            )
        return result.status, result.body

    return review


def _read_body(limits: BodyLimits, length: int | None) -> bytes:
    """The request body, read once (a Content-Length past the limit was refused before reading).

    BodyLimits is the one limit (no MAX_CONTENT_LENGTH): so werkzeug hands over the server's own
    stream when the server ends it at the body's end (wsgi.input_terminated: gunicorn does, for
    Content-Length and chunked bodies alike), and no wrapper copies the body once more.
    """
    if length is not None:
        return request.stream.read(length)
    # Chunked: one byte past the limit tells a body that is too large.
    data = request.stream.read(limits.max_body + 1)
    if len(data) > limits.max_body:
        raise RequestEntityTooLarge()
    return data


def create_app(state: WebhookState, limits: BodyLimits | None = None) -> Flask:
    app = Flask("raygate-webhook", static_folder=None)  # no static files: one rule fewer to match
    limits = limits or BodyLimits()
    json_headers = {"Content-Type": JSON_TYPE}

    def review_view(endpoint: str, decide: Decide) -> Callable[[], Response]:
        review = _reviewer(state, endpoint, decide)

        def view() -> Response:
            length = request.content_length
            if length is not None and limits.too_large(length):
                raise RequestEntityTooLarge()  # unread, and without waiting for the large-body slot
            with limits.reading(length):
                status, body = review(_read_body(limits, length))
            return Response(body, status, json_headers)

        view.__name__ = f"{endpoint}_route"
        return view

    app.add_url_rule("/mutate", view_func=review_view("mutate", mutate), methods=["POST"])
    app.add_url_rule("/validate", view_func=review_view("validate", validate), methods=["POST"])

    @app.errorhandler(413)
    def too_large(err: Exception) -> Response:
        # Sent before the body is read. gunicorn then discards at most 64 KiB of what is left and closes
        # the connection if more is left (an application may not send Connection: close under WSGI).
        return Response(limits.refusal(request.content_length), 413, json_headers)

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
