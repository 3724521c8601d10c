"""The webhook's app served as `raygate webhook` serves it (gunicorn, the KeepAliveThreadWorker, TLS,
real sockets): reviews on one kept-alive connection, answered by the review handler without Flask; a
chunked review; a body over the limit, answered 413 without being waited for, after which the server
closes the connection; every other route through Flask."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from builders import RayJob, review
from serving import Client, Server, start

from tests.apps.webhook import MAX_BODY


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp("served"), "tests.apps.webhook:app")
    yield s
    s.stop()


def test_reviews_on_one_kept_alive_connection_never_reach_flask(server: Server) -> None:
    c = Client(server)
    for i, path in enumerate(["/mutate", "/validate"] * 3):
        c.send(orjson.dumps(review(RayJob(f"job-{i}").obj(), uid=f"u{i}")), path=path)
        served = c.answer()
        assert served.status == 200 and served.headers["content-type"] == "application/json"
        assert served.headers.get("connection", "").lower() != "close"
        assert "x-flask" not in served.headers, "a review went through Flask"
        answer = orjson.loads(served.body)["response"]
        assert answer["uid"] == f"u{i}"
        if path == "/mutate":
            assert answer["allowed"] is True and "patch" in answer
    c.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    health = c.answer()
    assert (health.status, health.body, health.headers.get("x-flask")) == (200, b"ok", "1")
    c.close()


def test_a_chunked_review_is_answered(server: Server) -> None:
    body = orjson.dumps(review(RayJob("chunked").obj(), uid="u-chunked"))
    half = len(body) // 2
    c = Client(server)
    c.sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:]))
    assert orjson.loads(c.receive())["response"]["uid"] == "u-chunked"
    c.close()


def test_a_body_over_the_limit_is_answered_413_at_once_and_the_connection_closed(server: Server) -> None:
    """50 MiB announced, 100 KiB sent: the answer comes without the rest, and the server ends the
    connection instead of reading 50 MiB it would throw away."""
    c = Client(server)
    c.sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (50 * 1024 * 1024)
                   + b"x" * (100 * 1024))
    answer = c.answer()
    assert answer.status == 413
    assert orjson.loads(answer.body)["error"] == (
        f"request body of 52428800 bytes is larger than the {MAX_BODY} bytes raygate accepts (--max-request-bytes)")
    assert c.closed_by_server()
    c.close()


def test_the_connection_still_serves_after_a_bad_review(server: Server) -> None:
    c = Client(server)
    c.send(b"{not json", path="/mutate")
    bad = c.answer()
    assert bad.status == 400 and "error" in orjson.loads(bad.body)
    c.send(orjson.dumps(review(RayJob("after").obj(), uid="u-after")), path="/mutate")
    assert orjson.loads(c.receive())["response"]["uid"] == "u-after"
    c.close()


def test_a_chunked_body_over_the_limit_is_answered_413(server: Server) -> None:
    c = Client(server)
    c.sock.sendall(b"POST /validate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"%x\r\n%s\r\n0\r\n\r\n" % (MAX_BODY + 1, b"x" * (MAX_BODY + 1)))
    answer = c.answer()
    assert answer.status == 413 and b"larger than the" in answer.body
    c.close()


def test_unknown_routes_and_methods(server: Server) -> None:
    c = Client(server)
    for method in (b"GET", b"PUT", b"OPTIONS"):
        c.sock.sendall(b"%s /mutate HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n" % method)
        wrong = c.answer()
        assert (wrong.status, wrong.headers["allow"]) == (405, "POST"), method
        assert "POST" in orjson.loads(wrong.body)["error"]
    c.send(b"{}", path="/nope")
    missing = c.answer()
    assert (missing.status, missing.headers.get("x-flask")) == (404, "1")
    c.send(orjson.dumps(review(RayJob("still").obj(), uid="u-still")), path="/validate")
    assert orjson.loads(c.receive())["response"]["uid"] == "u-still"  # the connection stayed usable
    c.close()
