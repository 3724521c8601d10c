"""TLS hot reload for the webhook server: one server-side SSLContext whose certificate follows the
files on disk, so a renewed Secret takes effect without restarting gunicorn.

Kubernetes updates a mounted Secret by swapping a symlink, which may leave mtimes untouched, so
the poll compares a hash of the resolved content. A new pair is loaded into a new context, which
then replaces the current one in a single assignment; the server asks for the context on every
connection (gunicorn's `ssl_context` hook does). Loading into the context handshakes are using
would not do: OpenSSL sets the certificate and the key one after the other, and a handshake in
between fails, as does every handshake after a `load_cert_chain` that failed halfway.

Only the standard library's ssl and hashlib: the served certificate is named in logs by its SHA-256
fingerprint (what `openssl x509 -noout -fingerprint -sha256` prints), not by fields read with the
`cryptography` package, whose import alone cost the webhook's processes about 10 MB (docs/benchmarks.md,
"The whole footprint"). Its serial and expiry are what `raygate certs status` shows.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from raygate.core.errors import RaygateError

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 10.0


@dataclass(frozen=True)
class Served:
    """The certificate new handshakes present."""

    fingerprint: str  # SHA-256 of its DER, colon-separated upper-case hex, as openssl prints it


_BEGIN, _END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"


def first_certificate(pem: bytes) -> Served | None:
    """The first certificate of a PEM file, or None when it holds none that can be read."""
    text = pem.decode("ascii", "replace")
    start = text.find(_BEGIN)
    end = text.find(_END, start)
    if start < 0 or end < 0:
        return None
    try:
        der = ssl.PEM_cert_to_DER_cert(text[start:end + len(_END)])
    except ValueError:  # bad base64 (binascii.Error is one)
        return None
    return Served(hashlib.sha256(der).digest().hex(":").upper())


def server_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@contextlib.contextmanager
def _snapshot(cert: bytes, key: bytes) -> Iterator[tuple[str, str]]:
    """Private copies of exactly the bytes that were read, as paths OpenSSL can open, so the files
    changing again between validation and loading cannot mix two pairs."""
    if hasattr(os, "memfd_create"):  # Linux: no writable filesystem needed (read-only root is common)
        fds = [os.memfd_create("raygate-cert"), os.memfd_create("raygate-key")]
        try:
            for fd, data in zip(fds, (cert, key), strict=True):
                os.write(fd, data)
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="raygate-tls-") as tmp:
        paths = (os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key"))
        for path, data in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        yield paths


class ReloadingContext:
    """The current `ssl.SSLContext` (server side, TLS 1.2 or newer) for `cert_file` and `key_file`,
    replaced by a freshly loaded one when the files' content changes.

    Connections made after a reload get the new certificate; established ones are unaffected. A bad
    pair (mismatched, partial, unreadable) is logged once and the current certificate stays.
    """

    def __init__(self, cert_file: str | Path, key_file: str | Path, *, interval: float = DEFAULT_INTERVAL) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.interval = interval
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._tried: bytes | None = None  # hash of the content last tried, good or bad
        self._loaded: Served | None = None
        self._last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.reload_if_changed():
            raise RaygateError(
                f"cannot load the serving certificate from {self.cert_file} and {self.key_file}: "
                f"{self._last_error}; run `raygate certs ensure` or check the mounted Secret"
            )

    @property
    def context(self) -> ssl.SSLContext:
        """The context for a new connection: ask again for each one, a reload replaces it."""
        if self._context is None:
            raise RuntimeError("no certificate loaded")  # __init__ guarantees one
        return self._context

    @property
    def loaded(self) -> Served:
        """The certificate new handshakes present."""
        if self._loaded is None:
            raise RuntimeError("no certificate loaded")  # __init__ guarantees one
        return self._loaded

    def _read(self) -> tuple[bytes, bytes] | str:
        try:
            return self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as exc:
            return f"cannot read {exc.filename}: {exc.strerror or exc}"

    def _load(self, cert: bytes, key: bytes) -> str | None:
        """Serve the pair from now on, in a context of its own; the error if it is unusable."""
        info = first_certificate(cert)
        if info is None:
            return f"{self.cert_file} holds no readable PEM certificate"
        fresh = server_context()
        try:
            with _snapshot(cert, key) as (cert_path, key_path):
                fresh.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, OSError) as exc:
            return f"the certificate and key do not form a usable pair: {exc}"
        self._context, self._loaded = fresh, info
        return None

    def reload_if_changed(self) -> bool:
        """Poll once. True when a new certificate is now served; False when nothing changed or the
        new content is unusable (then the previous certificate stays)."""
        error: str | None
        with self._lock:
            pair = self._read()
            if isinstance(pair, str):
                fingerprint, error = hashlib.sha256(pair.encode()).digest(), pair
            else:
                fingerprint, error = hashlib.sha256(pair[0] + b"\0" + pair[1]).digest(), None
            if fingerprint == self._tried:  # unchanged, or the same failure that was logged already
                return False
            self._tried = fingerprint
            if not isinstance(pair, str):
                error = self._load(*pair)
            if error:
                self._last_error = error
                if self._loaded is not None:
                    log.error(
                        "serving certificate not reloaded, keeping the current one",
                        extra={"cert_file": str(self.cert_file), "error": error,
                               "sha256": self._loaded.fingerprint},
                    )
                return False
            log.info(
                "serving certificate loaded",
                extra={"cert_file": str(self.cert_file), "sha256": self.loaded.fingerprint},
            )
            return True

    # --- background polling ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.reload_if_changed()
            except Exception:  # the poller must survive anything, or rotation silently stops
                log.exception("serving certificate poll failed", extra={"cert_file": str(self.cert_file)})

    def start(self) -> Self:
        """Poll every `interval` seconds in a daemon thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="raygate-tls-reload", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


GunicornSSLHook = Callable[[Any, Callable[[], ssl.SSLContext]], ssl.SSLContext]


def gunicorn_ssl_context(
    cert_file: str | Path, key_file: str | Path, *, interval: float = DEFAULT_INTERVAL
) -> GunicornSSLHook:
    """A gunicorn `ssl_context(config, default_ssl_context_factory)` hook returning the context loaded now.

    gunicorn calls the hook inside each worker (the gthread worker once per connection), and
    threads do not survive fork, so each worker process gets its own context and poller.
    gunicorn still needs `certfile`/`keyfile` set: they switch TLS on.
    """
    per_process: dict[int, ReloadingContext] = {}
    lock = threading.Lock()

    def hook(config: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        pid = os.getpid()
        with lock:
            reloading = per_process.get(pid)
            if reloading is None:
                reloading = per_process[pid] = ReloadingContext(cert_file, key_file, interval=interval).start()
        return reloading.context

    return hook
