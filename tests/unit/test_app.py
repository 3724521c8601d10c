"""The webhook app over the pure decision, through Flask's test client: every route answers, reviews
are answered by the review handler alone (never a Flask request), and the logging and metrics around
a decision never turn an answer into an HTTP 500."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from builders import RayJob, review
from flask import Flask
from flask.testing import FlaskClient

from raygate.kube.configsource import ConfigSource
from raygate.webhook.app import create_app
from raygate.webhook.state import WebhookState


@pytest.fixture
def state() -> WebhookState:
    s = WebhookState(config_source=ConfigSource(None).start())  # offline: defaults, every namespace opted in
    s.certificate_loaded.set()
    return s


@pytest.fixture
def app(state: WebhookState) -> Flask:
    app = create_app(state)
    app.config["PROPAGATE_EXCEPTIONS"] = True  # a bug in a route fails the test instead of becoming a 500
    return app


@pytest.fixture
def client(app: Flask, caplog: pytest.LogCaptureFixture) -> Iterator[FlaskClient]:
    caplog.set_level(logging.INFO, logger="raygate.webhook")
    yield app.test_client()


def test_reviews_are_answered_without_a_flask_request(app: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review handler is the one path for /mutate and /validate: Flask has no rule for them and
    never builds a request context for a review, whatever its outcome; it does for every other route."""
    assert {r.rule for r in app.url_map.iter_rules()} == {"/healthz", "/readyz", "/metrics"}
    opened: list[str] = []
    request_context = app.request_context

    def counted(environ: dict[str, Any]) -> Any:
        opened.append(environ["PATH_INFO"])
        return request_context(environ)

    monkeypatch.setattr(app, "request_context", counted)
    client = app.test_client()
    good = orjson.dumps(review(RayJob("train").obj(), uid="u1"))
    assert client.post("/mutate", data=good).status_code == 200
    assert client.post("/validate", data=good).status_code == 200
    assert client.post("/mutate", data=b"{not json").status_code == 400
    assert client.get("/validate").status_code == 405
    assert opened == []
    assert client.get("/healthz").status_code == 200 and client.post("/nope").status_code == 404
    assert opened == ["/healthz", "/nope"]


def test_mutate_answers_with_a_patch_and_logs_the_object_at_debug(
    client: FlaskClient, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="raygate.webhook")
    resp = client.post("/mutate", data=orjson.dumps(review(RayJob("train").obj(), uid="u1")))
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    body = resp.get_json()
    assert body["response"]["uid"] == "u1" and body["response"]["allowed"] is True
    ops = json.loads(base64.b64decode(body["response"]["patch"]))
    assert {"op": "add", "path": "/spec/suspend", "value": True} in ops
    record = next(r for r in caplog.records if r.getMessage() == "admission")
    assert (record.namespace, record.object, record.outcome) == ("team", "train", "mutated")  # type: ignore[attr-defined]


def test_at_info_only_refusals_are_logged(client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    client.post("/mutate", data=orjson.dumps(review(RayJob("admitted").obj(), uid="u1")))
    client.post("/mutate", data=orjson.dumps(review(RayJob("refused").shutdown_after_finish(False).obj(), uid="u2")))
    logged = [r for r in caplog.records if r.getMessage() == "admission"]
    assert [(r.object, r.outcome, r.levelname) for r in logged] == [  # type: ignore[attr-defined]
        ("refused", "refused", "INFO")]


def test_refusal_is_an_http_200_review_that_denies(client: FlaskClient) -> None:
    obj = RayJob("train").shutdown_after_finish(False).obj()
    for route in ("/mutate", "/validate"):
        resp = client.post(route, data=orjson.dumps(review(obj, uid="u2")))
        assert resp.status_code == 200
        answer = resp.get_json()["response"]
        assert answer["allowed"] is False and answer["status"]["code"] == 422
        assert "shutdownAfterJobFinishes" in answer["status"]["message"]


def test_validate_guard_denial_is_logged(client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    old = RayJob("train").held().obj()
    new = RayJob("train").held().suspend(False).obj()
    resp = client.post("/validate", data=orjson.dumps(review(new, operation="UPDATE", old=old, uid="u3")))
    answer = resp.get_json()["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert any(getattr(r, "user", None) == "alice" for r in caplog.records)


def test_body_that_is_not_a_review_is_http_400(client: FlaskClient) -> None:
    resp = client.post("/mutate", data=b"{not json")
    assert resp.status_code == 400 and "error" in resp.get_json()


def test_health_readiness_and_metrics(client: FlaskClient, state: WebhookState) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    client.post("/mutate", data=orjson.dumps(review(RayJob().obj())))
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'raygate_webhook_reviews_total{endpoint="mutate",kind="RayJob",mode="provisioning",outcome="mutated"}' \
        in metrics
    state.certificate_loaded.clear()
    resp = client.get("/readyz")
    assert resp.status_code == 503 and "certificate" in resp.get_data(as_text=True)


def test_readyz_names_the_config_version_in_force(client: FlaskClient, state: WebhookState) -> None:
    state.config_source.seen_version = "42"
    assert client.get("/readyz").headers["X-Raygate-Config-Version"] == "42"


def test_metric_labels_come_from_a_fixed_set_whatever_a_client_sends(client: FlaskClient) -> None:
    from raygate.webhook import metrics

    for i in range(20):
        made_up = {"apiVersion": "ray.io/v1", "kind": f"Kind{i}", "metadata": {"name": "x", "namespace": "team"}}
        body = review(made_up, uid=f"u{i}")
        body["request"]["kind"]["kind"] = f"Kind{i}"
        assert client.post("/mutate", data=orjson.dumps(body)).status_code == 200
    text = metrics.exposition()[0].decode()
    assert 'kind="other"' in text and "Kind1" not in text
