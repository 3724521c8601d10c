"""The webhook's WSGI app: one path per route.

`POST /mutate` and `/validate` are answered by `ReviewRoutes`, a small WSGI handler installed as the
Flask app's `wsgi_app`; no Flask view exists for them. Flask serves every other path: `/healthz`,
`/readyz`, `/metrics` and the 404s.

Why reviews bypass Flask: its per-request machinery (request and app contexts, URL matching, the
Response object) was measured at about 130 µs of CPU per served review on 2 cores (0.43-0.49 ms per
review with it, 0.31-0.34 ms without), and with the review routes as Flask views the webhook answered
20-35% fewer reviews/s and missed its 2 ms p50 at concurrency 8 (docs/benchmarks.md, "The webhook
served"). A review needs none of that machinery: a body in, a status and a JSON body out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import orjson
from flask import Flask, Response

from raygate.webhook import metrics
from raygate.webhook.body_limits import BodyLimits
from raygate.webhook.decision import Decide, mutate, validate
from raygate.webhook.handler import answer
from raygate.webhook.review import kind_of, username
from raygate.webhook.state import WebhookState

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("raygate.webhook")
JSON_TYPE = "application/json"

Reviewer = Callable[[bytes], tuple[int, bytes]]

# Every status a review route answers with (answer() itself gives 200 or 400).
_STATUS_LINES = {200: "200 OK", 400: "400 Bad Request", 405: "405 Method Not Allowed",
                 413: "413 Request Entity Too Large"}


def _reviewer(state: WebhookState, endpoint: str, decide: Decide) -> Reviewer:
    """Body in, (HTTP status, JSON body) out, with the metrics and the log line around the decision."""
    latency = metrics.LATENCY.labels(endpoint)
    reviews = metrics.ReviewCounters(endpoint)
    in_flight = metrics.IN_FLIGHT
    perf_counter = time.perf_counter

    def review(body: bytes) -> tuple[int, bytes]:
        started = perf_counter()
        in_flight.inc()
        try:
            result = answer(body, decide, state.config, state.namespace_labels, state.claim_template, state.members)
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


class ReviewRoutes:
    """WSGI middleware that alone answers every request to a review path; other paths go to `app`.

    An exception (a bug: answer() never raises) is left to the WSGI server, which logs it and
    answers 500, as gunicorn does.
    """

    def __init__(self, app: WSGIApplication, routes: Mapping[str, Reviewer], limits: BodyLimits) -> None:
        self.app = app
        self.routes = dict(routes)
        self.limits = limits

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        review = self.routes.get(environ.get("PATH_INFO", ""))
        if review is None:
            return self.app(environ, start_response)
        status, body = self._review(environ, review)
        headers = [("Content-Type", JSON_TYPE), ("Content-Length", str(len(body)))]
        if status == 405:
            headers.append(("Allow", "POST"))
        start_response(_STATUS_LINES[status], headers)
        return [body]

    def _review(self, environ: WSGIEnvironment, review: Reviewer) -> tuple[int, bytes]:
        method = environ.get("REQUEST_METHOD", "")
        if method != "POST":
            return 405, orjson.dumps({"error": f"{method} is not allowed here: send the AdmissionReview with POST"})
        declared = environ.get("CONTENT_LENGTH", "")
        length = int(declared) if declared.isdigit() else None  # None: chunked, or no body at all
        if length is not None and self.limits.too_large(length):
            # Refused unread, without waiting for the large-body slot. gunicorn then discards at most
            # 64 KiB of the rest and closes the connection if more is left (a WSGI app may not send
            # Connection: close itself).
            return 413, self.limits.refusal(length)
        with self.limits.reading(length):
            body = self._read(environ, length)
            if body is None:
                return 413, self.limits.refusal(None)
            return review(body)

    def _read(self, environ: WSGIEnvironment, length: int | None) -> bytes | None:
        """The body, read once from the server's own stream; None for a chunked body over the limit."""
        stream = environ["wsgi.input"]
        if length is not None:
            return stream.read(length) if length else b""
        if not environ.get("wsgi.input_terminated"):
            # No length, and a server that does not end the stream at the body's end: reading could
            # block on the next request. Nothing is read, as werkzeug does (gunicorn always ends it).
            return b""
        # One byte past the limit tells a chunked body that is too large.
        data: bytes = stream.read(self.limits.max_body + 1)
        return None if self.limits.too_large(len(data)) else data


def create_app(state: WebhookState, limits: BodyLimits | None = None) -> Flask:
    app = Flask("raygate-webhook", static_folder=None)  # no static files: one rule fewer to match

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

    routes = {"/mutate": _reviewer(state, "mutate", mutate), "/validate": _reviewer(state, "validate", validate)}
    app.wsgi_app = ReviewRoutes(app.wsgi_app, routes, limits or BodyLimits())  # type: ignore[method-assign]
    return app
