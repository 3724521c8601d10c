"""TLS hot reload, checked with real handshakes against a server that is never restarted."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from waiting import wait

from raygate.core import pki
from raygate.core.errors import RaygateError
from raygate.webhook.tls import ReloadingContext, gunicorn_ssl_context

YEAR = dt.timedelta(days=365)


@pytest.fixture(scope="module")
def ca() -> pki.KeyPair:
    return pki.make_ca("reload-test-ca", YEAR)


def leaf(ca: pki.KeyPair) -> pki.KeyPair:
    return pki.make_leaf(ca, "webhook", YEAR, sans=["127.0.0.1", "localhost"])


def serial(pair: pki.KeyPair) -> int:
    return pair.cert.serial_number


def fingerprint(pair: pki.KeyPair) -> str:
    """As the webhook names the certificate it serves (and `openssl x509 -noout -fingerprint -sha256`)."""
    from cryptography.hazmat.primitives import hashes

    return pair.cert.fingerprint(hashes.SHA256()).hex(":").upper()


def put(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class TLSServer:
    """Accepts connections on 127.0.0.1 and completes the handshake with the context `context()`
    returns for each connection, as gunicorn's `ssl_context` hook is called for each."""

    def __init__(self, context: Callable[[], ssl.SSLContext]) -> None:
        self.context = context
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            try:
                with self.context().wrap_socket(conn, server_side=True) as tls:
                    self.handshakes += 1
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                conn.close()

    def peer_serial(self, ca: pki.KeyPair) -> int:
        client = ssl.create_default_context(cadata=ca.cert_pem.decode())
        client.maximum_version = ssl.TLSVersion.TLSv1_2  # the oldest version the server must accept
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, client.wrap_socket(
            raw, server_hostname="127.0.0.1"
        ) as tls:
            der = tls.getpeercert(binary_form=True)
            assert tls.recv(2) == b"ok"
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join()


@pytest.fixture
def files(tmp_path: Path, ca: pki.KeyPair) -> tuple[Path, Path, pki.KeyPair]:
    first = leaf(ca)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    put(cert, first.cert_pem)
    put(key, first.key_pem)
    return cert, key, first


@pytest.fixture
def server_for() -> Iterator[list[TLSServer]]:
    servers: list[TLSServer] = []
    yield servers
    for s in servers:
        s.close()


def serve(servers: list[TLSServer], reloading: ReloadingContext) -> TLSServer:
    server = TLSServer(lambda: reloading.context)
    servers.append(server)
    return server


def test_context_is_a_tls12_minimum_server_context(files: tuple[Path, Path, pki.KeyPair]) -> None:
    cert, key, _ = files
    ctx = ReloadingContext(cert, key).context
    assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2
    assert ctx.protocol is ssl.PROTOCOL_TLS_SERVER


def test_new_certificate_is_served_without_restarting_the_server(
    files: tuple[Path, Path, pki.KeyPair], ca: pki.KeyPair, server_for: list[TLSServer]
) -> None:
    cert, key, first = files
    reloading = ReloadingContext(cert, key)
    server = serve(server_for, reloading)
    assert server.peer_serial(ca) == serial(first)
    assert reloading.reload_if_changed() is False  # nothing changed

    second = leaf(ca)
    put(key, second.key_pem)
    put(cert, second.cert_pem)
    assert reloading.reload_if_changed() is True
    assert server.peer_serial(ca) == serial(second)
    assert reloading.loaded.fingerprint == fingerprint(second)


@pytest.mark.parametrize(
    "breakage",
    ["new cert, old key", "new key, old cert", "garbage cert", "truncated key", "missing key", "empty cert"],
)
def test_bad_files_keep_the_old_certificate_and_log_once(
    breakage: str,
    files: tuple[Path, Path, pki.KeyPair],
    ca: pki.KeyPair,
    server_for: list[TLSServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cert, key, first = files
    reloading = ReloadingContext(cert, key)
    server = serve(server_for, reloading)
    other = leaf(ca)
    # Half-finished updates first: OpenSSL drops the old key when it loads a certificate that does
    # not match it, so loading such a pair into the live context would break every handshake.
    if breakage == "new cert, old key":
        put(cert, other.cert_pem)
    elif breakage == "new key, old cert":
        put(key, other.key_pem)
    elif breakage == "garbage cert":
        put(cert, b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    elif breakage == "truncated key":
        put(key, other.key_pem[: len(other.key_pem) // 2])
    elif breakage == "missing key":
        key.unlink()
    else:
        put(cert, b"")

    with caplog.at_level(logging.ERROR, logger="raygate.webhook.tls"):
        assert reloading.reload_if_changed() is False
        assert reloading.reload_if_changed() is False
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "keeping the current one" in errors[0].getMessage()
    assert server.peer_serial(ca) == serial(first)
    assert reloading.loaded.fingerprint == fingerprint(first)

    # Repaired: the next poll picks up the good pair.
    put(cert, other.cert_pem)
    put(key, other.key_pem)
    assert reloading.reload_if_changed() is True
    assert server.peer_serial(ca) == serial(other)


def test_kubernetes_style_symlink_swap_is_picked_up_by_the_poller(
    tmp_path: Path, ca: pki.KeyPair, server_for: list[TLSServer]
) -> None:
    """kubelet writes a new timestamped directory and swaps the `..data` symlink; the visible
    tls.crt/tls.key symlinks and their mtimes never change."""
    first, second = leaf(ca), leaf(ca)
    for name, pair in (("..v1", first), ("..v2", second)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tls.crt").write_bytes(pair.cert_pem)
        (tmp_path / name / "tls.key").write_bytes(pair.key_pem)
        os.utime(tmp_path / name / "tls.crt", (1_000_000, 1_000_000))
        os.utime(tmp_path / name / "tls.key", (1_000_000, 1_000_000))
    (tmp_path / "..data").symlink_to("..v1")
    for f in ("tls.crt", "tls.key"):
        (tmp_path / f).symlink_to(f"..data/{f}")

    with ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key", interval=0.05) as reloading:
        server = serve(server_for, reloading)
        assert server.peer_serial(ca) == serial(first)
        (tmp_path / "..data_tmp").symlink_to("..v2")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        wait(lambda: reloading.loaded.fingerprint == fingerprint(second), 10, "the swapped Secret to be loaded",
             interval=0.05)
        assert server.peer_serial(ca) == serial(second)


def test_unusable_files_at_start_are_a_clear_error(tmp_path: Path, ca: pki.KeyPair) -> None:
    pair, other = leaf(ca), leaf(ca)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(other.key_pem)
    with pytest.raises(RaygateError, match="do not form a usable pair"):
        ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key")
    with pytest.raises(RaygateError, match="cannot read"):
        ReloadingContext(tmp_path / "nope.crt", tmp_path / "tls.key")


def test_poller_thread_stops(files: tuple[Path, Path, pki.KeyPair]) -> None:
    def pollers() -> int:
        return sum(t.name == "raygate-tls-reload" for t in threading.enumerate())

    cert, key, _ = files
    before = pollers()
    reloading = ReloadingContext(cert, key, interval=0.01).start()
    assert reloading.start() is reloading and pollers() == before + 1  # start is idempotent
    reloading.stop()
    assert pollers() == before


def test_gunicorn_hook_returns_one_reloading_context_per_process(
    files: tuple[Path, Path, pki.KeyPair], ca: pki.KeyPair, server_for: list[TLSServer]
) -> None:
    cert, key, first = files
    hook = gunicorn_ssl_context(cert, key, interval=3600)

    def default_factory() -> ssl.SSLContext:
        raise AssertionError("the default factory must not be used")

    ctx = hook(object(), default_factory)
    assert hook(object(), default_factory) is ctx  # one loaded context, until the files change
    server = TLSServer(lambda: hook(object(), default_factory))
    server_for.append(server)
    assert server.peer_serial(ca) == serial(first)


def test_handshakes_during_reloads_never_fail(
    files: tuple[Path, Path, pki.KeyPair], ca: pki.KeyPair, server_for: list[TLSServer]
) -> None:
    """A renewal lands while the API server keeps connecting: no handshake may see half a pair."""
    cert, key, first = files
    second = leaf(ca)
    reloading = ReloadingContext(cert, key)
    server = serve(server_for, reloading)
    failures: list[str] = []
    seen: set[int] = set()
    done = threading.Event()

    def connect() -> None:
        while not done.is_set():
            try:
                seen.add(server.peer_serial(ca))
            except (ssl.SSLError, OSError, AssertionError) as err:
                failures.append(repr(err))

    client = threading.Thread(target=connect)
    client.start()
    try:
        for i in range(300):
            pair = (second, first)[i % 2]
            put(key, pair.key_pem)
            put(cert, pair.cert_pem)
            assert reloading.reload_if_changed() is True
    finally:
        done.set()
        client.join()
    assert failures == [], failures[:3]
    assert seen == {serial(first), serial(second)}
