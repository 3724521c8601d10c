"""The Flask shell around the pure decision: routes, metrics and a log line per decision.

POST /mutate and /validate, the only hot routes, are answered by a thin WSGI layer in front of
Flask (`_FastReviews`): Flask's request context, URL matching and Response object cost more CPU
than the decision itself. The layer answers exactly what the Flask routes answer (same status,
body and headers); anything it does not recognise as a plain review POST goes to Flask unchanged.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import InternalServerError, RequestEntityTooLarge

from raygate.webhook import metrics
from raygate.webhook.decision import Decide, mutate, validate
from raygate.webhook.handler import answer
from raygate.webhook.limits import BodyLimits
from raygate.webhook.review import kind_of, username
from raygate.webhook.state import WebhookState

log = logging.getLogger("raygate.webhook")
JSON_TYPE = "application/json"

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


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
            result = answer(body, decide, state.config, state.namespace_labels, state.claim_template)
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


_STATUS_LINES = {200: "200 OK", 400: "400 BAD REQUEST"}  # werkzeug's spelling, as Flask sends it

class _FastReviews:
    """WSGI middleware answering `POST /mutate` and `POST /validate` without Flask.

    Only a request Flask would route to those views and read the same way is taken: exact path,
    no script name, POST, and a plain Content-Length body (no chunked or streamed input). Everything
    else, including every other route and method, is passed to Flask's own WSGI app.
    """

    def __init__(self, app: Flask, flask_wsgi: WSGIApp, routes: dict[str, Callable[[bytes], tuple[int, bytes]]],
                 limits: BodyLimits) -> None:
        self.app = app
        self.flask_wsgi = flask_wsgi
        self.routes = routes
        self.limits = limits

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        review = self.routes.get(environ.get("PATH_INFO", ""))
        length = environ.get("CONTENT_LENGTH")
        if (review is None or environ.get("REQUEST_METHOD") != "POST" or environ.get("SCRIPT_NAME")
                or not length or not length.isdigit() or environ.get("HTTP_TRANSFER_ENCODING")):
            return self.flask_wsgi(environ, start_response)
        n = int(length)
        if self.limits.too_large(n):
            # Refused unread; closing the connection spares reading the rest just to find the next request.
            out = self.limits.refusal(n)
            start_response("413 REQUEST ENTITY TOO LARGE", [("Content-Type", JSON_TYPE),
                                                            ("Content-Length", str(len(out))), ("Connection", "close")])
            return [out]
        try:
            with self.limits.reading(n):
                body = environ["wsgi.input"].read(n) if n else b""
                status, out = review(body)
        except Exception:
            if self.app.config.get("PROPAGATE_EXCEPTIONS"):
                raise
            self.app.log_exception(sys.exc_info())  # what Flask does for an unhandled error: log, then 500
            return InternalServerError()(environ, start_response)
        start_response(_STATUS_LINES.get(status) or f"{status} {_reason(status)}",
                       [("Content-Type", JSON_TYPE), ("Content-Length", str(len(out)))])
        return [out]


def _reason(status: int) -> str:
    from werkzeug.http import HTTP_STATUS_CODES

    return HTTP_STATUS_CODES.get(status, "UNKNOWN").upper()


def create_app(state: WebhookState, limits: BodyLimits | None = None) -> Flask:
    app = Flask("raygate-webhook")
    limits = limits or BodyLimits()
    # Flask's own routes see the bodies the fast path passes on (chunked ones): werkzeug stops reading
    # past this and answers 413.
    app.config["MAX_CONTENT_LENGTH"] = limits.max_body
    reviewers = {"/mutate": _reviewer(state, "mutate", mutate), "/validate": _reviewer(state, "validate", validate)}

    def review(path: str) -> Response:
        with limits.reading(request.content_length):
            # Not get_data(): past MAX_CONTENT_LENGTH werkzeug's stream stops at the limit and returns a
            # cut body; it raises 413 only when asked for more, so ask.
            data = request.stream.read()
            if len(data) >= limits.max_body and request.stream.read(1):
                raise RequestEntityTooLarge()
            status, body = reviewers[path](data)
        return Response(body, status=status, mimetype=JSON_TYPE)

    @app.errorhandler(413)
    def too_large(err: Exception) -> Response:
        return Response(limits.refusal(request.content_length), status=413, mimetype=JSON_TYPE,
                        headers={"Connection": "close"})

    @app.post("/mutate")
    def mutate_route() -> Response:
        return review("/mutate")

    @app.post("/validate")
    def validate_route() -> Response:
        return review("/validate")

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

    app.wsgi_app = _FastReviews(app, app.wsgi_app, reviewers, limits)  # type: ignore[method-assign]
    return app
