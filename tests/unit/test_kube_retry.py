"""raygate's API client sends a request again when the API server answers 429 (it did not handle
it: a CRD's storage still starting, load shedding), waiting as Retry-After says; then gives up
with the server's own error. Checked against a scripted HTTP endpoint: no API server answers 429
on demand, and this is about the client's HTTP behaviour only."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from raygate.kube import client as kube
from raygate.kube.client import ApiError, Kube


class Scripted(BaseHTTPRequestHandler):
    answers: list[int] = []
    seen: list[str] = []

    def do_GET(self) -> None:
        status = self.answers.pop(0) if self.answers else 200
        self.seen.append(self.path)
        body = json.dumps({"kind": "Status", "reason": "TooManyRequests", "message": "storage is (re)initializing"}
                          if status == 429 else {"items": []}).encode()
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    Scripted.answers, Scripted.seen = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()


def _kube(srv: ThreadingHTTPServer) -> Kube:
    conf = client.Configuration()
    conf.host = f"http://127.0.0.1:{srv.server_address[1]}"
    return Kube(conf)


def test_429_is_sent_again_until_answered(server: ThreadingHTTPServer) -> None:
    Scripted.answers = [429, 429]
    k = _kube(server)
    assert k.request("GET", "/apis/autoscaling.x-k8s.io/v1/provisioningrequests") == {"items": []}
    assert len(Scripted.seen) == 3 and k.requests["GET"] == 3


def test_429_past_the_retries_is_the_servers_error(server: ThreadingHTTPServer) -> None:
    Scripted.answers = [429] * (kube.TOO_MANY_REQUESTS_RETRIES + 1)
    with pytest.raises(ApiError) as err:
        _kube(server).request("GET", "/api/v1/namespaces")
    assert err.value.status == 429 and "storage is (re)initializing" in str(err.value)
    assert len(Scripted.seen) == kube.TOO_MANY_REQUESTS_RETRIES + 1


@pytest.mark.parametrize(("header", "wait"), [(None, 1.0), ("0", 0.1), ("2", 2.0), ("120", 5.0), ("soon", 1.0)])
def test_retry_after_is_honoured_within_bounds(header: str | None, wait: float) -> None:
    assert kube._retry_after(header) == wait
