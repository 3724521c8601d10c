"""The webhook's gunicorn worker (gthread that keeps a busy keep-alive connection on its thread),
run as `raygate webhook` runs it: gunicorn over TLS, real sockets, an app that echoes each body."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gunicorn
import pytest
from serving import REPO, TIMEOUT, Client, Server, start

from raygate.webhook.worker import SUPPORTED_GUNICORN, check_gunicorn


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    s = start(tmp_path, "tests.apps.echo:app", threads=getattr(request, "param", 2))
    yield s
    s.stop()


def test_one_connection_serves_many_requests_in_order(server: Server) -> None:
    c = Client(server)
    for i in range(200):
        c.send(b"review %d" % i)
        assert c.receive() == b"review %d" % i
    c.close()


def test_pipelined_requests_are_all_answered_in_order(server: Server) -> None:
    c = Client(server)
    for round_ in range(20):
        bodies = [b"r%d-%d" % (round_, i) * 50 for i in range(3)]
        c.send(*bodies)
        assert [c.receive() for _ in bodies] == bodies
    c.close()


@pytest.mark.parametrize("server", [1, 2], indirect=True, ids=["1-thread", "2-threads"])
def test_more_busy_connections_than_threads_are_all_served(server: Server) -> None:
    """Connections beyond the thread count wait their turn on the poller and are never starved by
    threads that keep their own connection."""
    errors: list[str] = []
    answered = [0] * 6

    def run(n: int) -> None:
        try:
            c = Client(server)
            for i in range(40):
                c.send(b"c%d-%d" % (n, i))
                assert c.receive() == b"c%d-%d" % (n, i)
                answered[n] += 1
            c.close()
        except (AssertionError, OSError) as err:
            errors.append(f"connection {n}: {err!r}")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert answered == [40] * 6


@pytest.mark.parametrize("server", [2], indirect=True, ids=["2-threads"])
def test_connections_kept_idle_after_their_handshake_hold_no_thread(server: Server) -> None:
    """Go's HTTP client (the API server's) keeps a connection it dialed but did not need idle for later, handshake
    done and no request sent: more of them than threads must not leave a request unanswered."""
    idle = [Client(server) for _ in range(4)]  # TLS handshakes done, nothing sent
    try:
        c = Client(server)
        started = time.monotonic()
        c.send(b"still served")
        assert c.receive() == b"still served"
        assert time.monotonic() - started < 2, "a thread was held by an idle connection"
        idle[0].send(b"later")  # an idle one used at last is served as any other
        assert idle[0].receive() == b"later"
        c.close()
    finally:
        for i in idle:
            i.close()


def test_idle_connection_is_picked_up_again_after_a_pause(server: Server) -> None:
    """A pause longer than the linger hands the connection back to the poller; the next request on
    it is still answered."""
    c = Client(server)
    c.send(b"before")
    assert c.receive() == b"before"
    time.sleep(0.3)
    c.send(b"after")
    assert c.receive() == b"after"
    c.close()


def test_sigterm_stops_the_server_while_connections_are_kept_alive(server: Server) -> None:
    clients = []
    for i in range(3):  # each sends at once: gthread gives a thread to a connection until its first request
        c = Client(server)
        c.send(b"hello %d" % i)
        assert c.receive() == b"hello %d" % i
        clients.append(c)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=TIMEOUT) == 0
    for c in clients:
        c.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["one-after-the-other", "pipelined"])
def test_two_requests_on_one_kept_alive_connection_are_served_by_one_thread(tmp_path: Path, pipelined: bool) -> None:
    """The worker's point: the thread that answered a request serves the next one on the same
    connection itself. The app says which thread served it and how often the worker handed a
    connection to its pool; stock gthread (or a gunicorn whose handle() the worker misreads) hands
    the connection back to the poller, which hands it to the pool again."""
    server = start(tmp_path, "tests.apps.threads:app", worker="tests.apps.threads.CountingWorker")
    try:
        c = Client(server)
        if pipelined:
            c.send(b"first", b"second")
            answers = [c.answer(), c.answer()]
        else:
            c.send(b"first")
            answers = [c.answer()]
            c.send(b"second")
            answers.append(c.answer())
        c.close()
    finally:
        server.stop()
    assert [a.body for a in answers] == [b"first", b"second"]
    assert all(a.status == 200 and a.headers["connection"] == "keep-alive" for a in answers)
    assert answers[0].headers["x-thread"] == answers[1].headers["x-thread"]
    assert answers[0].headers["x-handoffs"] == answers[1].headers["x-handoffs"]  # no trip through the poller between


def test_the_worker_runs_on_the_gunicorn_installed() -> None:
    check_gunicorn(gunicorn.version_info)
    low, high = SUPPORTED_GUNICORN
    pin = f"gunicorn>={low[0]}.{low[1]},<{high[0]}"
    assert pin in (REPO / "pyproject.toml").read_text(), f"pyproject.toml should pin {pin}, as the worker checks"


@pytest.mark.parametrize("version", [(23, 0, 0), (25, 3, 0), (28, 0, 0)])
def test_the_worker_refuses_to_start_on_another_gunicorn(tmp_path: Path, version: tuple[int, ...]) -> None:
    """On a gunicorn whose internals differ the worker would quietly lose its point (or worse): gunicorn
    must stop at start, before any worker runs, and say why."""
    run = (f"import sys, gunicorn; gunicorn.version_info = {version!r}; "
           "from gunicorn.app.wsgiapp import run; sys.exit(run())")
    done = subprocess.run(
        [sys.executable, "-c", run, "--worker-class", "raygate.webhook.worker.KeepAliveThreadWorker",
         "--bind", "127.0.0.1:0", "tests.apps.echo:app"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert done.returncode == 1, done
    wanted = ".".join(map(str, version))
    assert "needs gunicorn >=26.0,<28.0" in done.stderr and f"this is gunicorn {wanted}" in done.stderr, done.stderr
    assert "Booting worker" not in done.stderr
