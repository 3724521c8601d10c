"""The WSGI fast path for POST /mutate and /validate answers byte for byte what the Flask routes answer."""

from __future__ import annotations

import io
import sys
from typing import Any

import orjson
import pytest
from builders import RayJob, review
from flask import Flask

from raygate.configsource import ConfigSource
from webhook.app import create_app
from webhook.state import WebhookState


@pytest.fixture
def app() -> Flask:
    s = WebhookState(config_source=ConfigSource(None).start())
    s.certificate_loaded.set()
    return create_app(s)


def _call(wsgi: Any, path: str, body: bytes, method: str = "POST") -> tuple[str, list[tuple[str, str]], bytes]:
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
               "SERVER_NAME": "localhost", "SERVER_PORT": "9443", "SERVER_PROTOCOL": "HTTP/1.1",
               "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
               "wsgi.url_scheme": "https", "wsgi.errors": sys.stderr, "wsgi.multithread": True,
               "wsgi.multiprocess": True, "wsgi.run_once": False, "wsgi.version": (1, 0)}
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen["status"], seen["headers"] = status, headers

    out = wsgi(environ, start_response)
    data = b"".join(out)
    if hasattr(out, "close"):
        out.close()
    return seen["status"], list(seen["headers"]), data


@pytest.mark.parametrize(("path", "body"), [
    ("/mutate", orjson.dumps(review(RayJob("train").obj(), uid="u1"))),
    ("/validate", orjson.dumps(review(RayJob("train").obj(), uid="u1"))),
    ("/mutate", orjson.dumps(review(RayJob("train").shutdown_after_finish(False).obj(), uid="u2"))),
    ("/validate", b"{not json"),
    ("/mutate", b""),
])
def test_fast_path_matches_flask(app: Flask, path: str, body: bytes) -> None:
    fast = _call(app.wsgi_app, path, body)
    flask = _call(app.wsgi_app.flask_wsgi, path, body)  # type: ignore[attr-defined]
    assert fast == flask


def test_other_methods_and_routes_still_go_to_flask(app: Flask) -> None:
    assert _call(app.wsgi_app, "/mutate", b"", method="GET")[0].startswith("405")
    assert _call(app.wsgi_app, "/healthz", b"", method="GET")[0] == "200 OK"
