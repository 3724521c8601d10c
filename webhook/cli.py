"""`raygate webhook`: serve the admission webhook."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from raygate.core import keys
from raygate.core.errors import RaygateError
from raygate.webhook.body_limits import DEFAULT_MAX_BODY

if TYPE_CHECKING:
    from raygate.webhook.server import Companion

# What `raygate webhook` runs with unless told otherwise (the Deployment and the chart pass no flags for them),
# and what the benchmarks measure as shipped.
WORKERS = 1
THREADS = 2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "webhook",
        help="serve the admission webhook (gunicorn, TLS)",
        description="Serve /mutate, /validate, /healthz, /readyz and /metrics over TLS with gunicorn gthread workers.",
    )
    add_arguments(p)
    p.add_argument("--workers", type=int, default=WORKERS, help="worker processes (default: %(default)s)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    p.add_argument(
        "--namespace", default=os.environ.get("POD_NAMESPACE", keys.SYSTEM_NAMESPACE),
        help="namespace of the raygate-config ConfigMap (default: $POD_NAMESPACE or %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The webhook's own flags (`raygate webhook` and `raygate serve`; both add --kubeconfig, --namespace and
    --log-level themselves)."""
    p.add_argument("--port", type=int, default=keys.WEBHOOK_PORT, help="TLS port (default: %(default)s)")
    p.add_argument("--bind", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    p.add_argument("--tls-cert-file", required=True, help="serving certificate (PEM); reloaded when it changes")
    p.add_argument("--tls-key-file", required=True, help="private key of the serving certificate (PEM)")
    p.add_argument("--threads", type=int, default=THREADS, help="threads per worker (default: %(default)s)")
    p.add_argument("--max-request-bytes", type=_positive, default=DEFAULT_MAX_BODY,
                   help="larger review bodies are refused with 413, unread (default: %(default)s)")
    p.add_argument("--worker-tmp-dir", default=None, help="writable directory for worker heartbeats and metrics")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, not {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    serve(args, args.workers)
    return 0


def serve(args: argparse.Namespace, workers: int, companion: Companion | None = None) -> None:
    """Serve until SIGTERM, with `workers` worker processes, each running `companion` beside the app."""
    for flag, path in (("--tls-cert-file", args.tls_cert_file), ("--tls-key-file", args.tls_key_file)):
        if not Path(path).is_file():
            raise RaygateError(
                f"{flag} {path} does not exist: run `raygate certs ensure --out-dir DIR` or mount the Secret"
            )
    from raygate.kube.client import Kube
    from raygate.webhook import server

    Kube.connect(args.kubeconfig)  # fail here with one clear line rather than in every worker
    server.serve(
        server.ServerOptions(
            cert_file=args.tls_cert_file, key_file=args.tls_key_file, bind=args.bind, port=args.port,
            workers=workers, threads=args.threads, kubeconfig=args.kubeconfig, namespace=args.namespace,
            log_level=args.log_level, worker_tmp_dir=args.worker_tmp_dir, max_request_bytes=args.max_request_bytes,
            companion=companion,
        )
    )
