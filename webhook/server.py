"""gunicorn serving the webhook: gthread workers (see webhook/worker.py), TLS 1.2 or newer, keep-alive on.

Keep-alive matters: the API server reuses connections, and without it every review would pay a
TLS handshake (the sync worker closes each connection, which caps a 2-core pod at ~250 reviews/s).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gunicorn.app.base import BaseApplication

from raygate.core import logs
from raygate.webhook.body_limits import DEFAULT_MAX_BODY, BodyLimits
from raygate.webhook.cli import THREADS, WORKERS
from raygate.webhook.tls import gunicorn_ssl_context

log = logging.getLogger("raygate.webhook")


class Companion(Protocol):
    """Work that runs in the webhook's worker process beside the app: `raygate serve` runs the reconciler so."""

    MODULES: tuple[str, ...]  # imported in the master before it forks the worker, as PRELOAD is

    def start(self, exit_worker: Callable[[], None]) -> None:
        """In the worker, once the app is loaded; `exit_worker` ends the worker gracefully (its master starts
        another)."""

    def stop(self) -> None:
        """In the worker, as it exits."""


@dataclass(frozen=True)
class ServerOptions:
    cert_file: str
    key_file: str
    bind: str = "0.0.0.0"
    port: int = 9443
    workers: int = WORKERS
    threads: int = THREADS
    kubeconfig: str | None = None
    namespace: str = "raygate-system"
    log_level: str = "info"
    worker_tmp_dir: str | None = None
    max_request_bytes: int = DEFAULT_MAX_BODY
    companion: Companion | None = None


def _child_exit(server: Any, worker: Any) -> None:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


class WebhookServer(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        settings: dict[str, Any] = {
            "bind": [f"{o.bind}:{o.port}"],
            "workers": o.workers,
            "worker_class": "raygate.webhook.worker.KeepAliveThreadWorker",  # gthread, one tweak: see there
            "threads": o.threads,
            # Longer than the API server keeps an idle connection (its webhook client is client-go's transport:
            # IdleConnTimeout 90 s, from net/http's default): the client closes first, so a review is never sent
            # on a connection the server is closing, which fails it (a POST is not retried).
            "keepalive": 120,
            "timeout": 30,
            "graceful_timeout": 20,
            "certfile": o.cert_file,
            "keyfile": o.key_file,
            "ssl_context": gunicorn_ssl_context(o.cert_file, o.key_file),
            # No peer may set the scheme or forward a path (gunicorn's defaults let a loopback peer do both);
            # the webhook sits behind no proxy. With both lists empty, trusting every peer ("*") is trusting none,
            # and spares gunicorn parsing the peer's address on every request to ask whether it is a proxy (7 % of
            # a review's GIL-held time by py-spy). tests/unit/test_server_headers.py holds it.
            "forwarded_allow_ips": "*",
            "secure_scheme_headers": {},
            "forwarder_headers": "",
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "child_exit": _child_exit,
            "proc_name": "raygate-webhook",
        }
        if o.worker_tmp_dir:
            settings["worker_tmp_dir"] = o.worker_tmp_dir
        if (companion := o.companion) is not None:
            settings["post_worker_init"] = lambda worker: companion.start(lambda: setattr(worker, "alive", False))
            settings["worker_exit"] = lambda server, worker: companion.stop()
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        # Runs in each worker after fork: watches and threads must start here, not in the master.
        from raygate.kube.client import Kube
        from raygate.webhook.app import create_app
        from raygate.webhook.state import WebhookState

        logs.setup(self.options.log_level)
        kube = Kube.connect(self.options.kubeconfig, user_agent="raygate-webhook")
        state = WebhookState.connect(kube, self.options.namespace)
        # Load the certificate now, so /readyz reflects it and a bad one fails the worker at start.
        self.cfg.ssl_context(self.cfg, None)
        state.certificate_loaded.set()
        app = create_app(state, BodyLimits(self.options.max_request_bytes))
        # What is loaded now lives as long as the worker: freezing it keeps the cyclic collector from
        # walking it again, so a full collection during a review stays short (it showed in the p99).
        gc.collect()
        gc.freeze()
        # A review allocates a few thousand short-lived objects; with the default threshold (700) the
        # collector ran several times per review for nothing: a review leaves no reference cycle (it
        # never reaches Flask, whose URL match leaves one of 8 objects per request to the other routes).
        gc.set_threshold(50_000, 20, 20)
        return app


# What every worker imports, imported once in the master before it forks them (see preload()). Not the
# webhook's own metrics module (raygate.webhook.metrics, nor raygate.webhook.app or .state, which import
# it): its unlabelled metrics would get value files of the master's pid, and the master's 0 for
# raygate_config_valid (multiprocess mode "min") would hide every worker's 1.
PRELOAD = (
    "flask", "prometheus_client", "pydantic", "raygate.core.policy", "raygate.kube.client", "raygate.kube.configsource",
    "raygate.kube.informer", "raygate.webhook.decision", "raygate.webhook.handler", "raygate.webhook.body_limits",
)


def preload(extra: tuple[str, ...] = ()) -> None:
    """Import in the master what every worker runs, then freeze it.

    Forked workers then share those pages with the master instead of each importing a copy of its own
    (about 25 MB of the 60 MB a worker held, counted by PSS; docs/benchmarks.md, "The whole footprint"). Frozen
    (gc.freeze), the objects are never visited by a worker's cyclic collector, which would write to every
    page it visits and so copy it. Threads, sockets and watches still start in each worker (load())."""
    import importlib

    for name in (*PRELOAD, *extra):
        importlib.import_module(name)
    gc.collect()
    gc.freeze()


def serve(options: ServerOptions) -> None:
    """Run until SIGTERM. prometheus_client's multiprocess directory (several workers) is set before any import
    of it."""
    import tempfile

    base = options.worker_tmp_dir or None
    if options.workers > 1:  # one worker answers /metrics from its own registry: no value files to share
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="raygate-metrics-", dir=base))
    preload(options.companion.MODULES if options.companion is not None else ())
    WebhookServer(options).run()
