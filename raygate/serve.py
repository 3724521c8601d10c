"""`raygate serve`: the webhook and the reconciler in one process.

Kueue's controller serves its webhooks and runs its reconcilers in one process; raygate's two processes held the
same Python, pydantic, Kubernetes client and raygate core twice (docs/benchmarks.md, "One process"). Here gunicorn
serves the webhook as `raygate webhook` does, with one worker, and that worker runs the reconciler on threads of its
own, under the same leader election: every replica serves admission, one reconciles.
"""

from __future__ import annotations

import argparse
import os

from raygate.core import keys
from raygate.reconciler import cli as reconciler_cli
from raygate.reconciler.cli import CertificateRenewal
from raygate.webhook import cli as webhook_cli


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], *,
             renew_certificates: CertificateRenewal | None = None) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the admission webhook and run the reconciler, in one process",
        description="Serve the webhook (as `raygate webhook`, one gunicorn worker) and run the reconciler (as "
        f"`raygate reconciler`) in that worker: every replica serves admission; the one holding Lease "
        f"{keys.LEADER_LEASE} reconciles. The webhook serves on --port, the reconciler's /metrics, /healthz and "
        "/readyz on --metrics-port.",
    )
    webhook_cli.add_arguments(p)
    reconciler_cli.add_arguments(p)
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    p.add_argument(
        "--namespace", default=os.environ.get("POD_NAMESPACE", keys.SYSTEM_NAMESPACE),
        help="namespace of raygate-config and the leader Lease (default: $POD_NAMESPACE or %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (default: %(default)s)")
    p.set_defaults(func=run, renew_certificates=renew_certificates)


def run(args: argparse.Namespace) -> int:
    # One worker: a second would run a second reconciler (a standby, in the same pod) and hold its own copy of both.
    webhook_cli.serve(args, workers=1, companion=reconciler_cli.InWorker(args))
    return 0
