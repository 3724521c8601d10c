"""`raygate reconciler`: watch held Ray jobs, ask for their capacity, unsuspend them when it is there."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from raygate.core import keys
from raygate.core.errors import RaygateError
from raygate.reconciler.workqueue import BATCH_SECONDS

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from raygate.kube.client import Kube
    from raygate.kube.configsource import ConfigSource
    from raygate.reconciler.controller import Controller
    from raygate.reconciler.housekeeping import Housekeeping
    from raygate.reconciler.leader import LeaseTiming

log = logging.getLogger("raygate.reconciler")

CertificateRenewal = Callable[[str | None, str | None, str, threading.Event], None]
"""(kubeconfig, --as user, namespace, stop): renews the webhook certificate in `namespace` until stop is set."""


def _positive(text: str) -> float:
    if (value := _seconds(text)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def _seconds(text: str) -> float:
    """Seconds, 0 allowed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], *,
             renew_certificates: CertificateRenewal | None = None) -> None:
    """`renew_certificates`: what --manage-certs runs (the `raygate` command passes the certs component's)."""
    p = sub.add_parser(
        "reconciler",
        help="run the reconciler (ProvisioningRequests, PodGroups, unsuspend)",
        description="Watch held RayJobs and RayClusters; create their PodGroup (volcano mode), PodTemplates and "
        "ProvisioningRequest; unsuspend them when the capacity is Provisioned. One replica leads (Lease "
        f"{keys.LEADER_LEASE}); the others wait to take over.",
        epilog="A job that ran out of attempts has state Failed and stays suspended; to start it over at attempt 1: "
        f"kubectl label rayjob NAME -n NAMESPACE {keys.STATE_LABEL}=Pending --overwrite",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    p.add_argument(
        "--namespace", default=os.environ.get("POD_NAMESPACE", keys.SYSTEM_NAMESPACE),
        help="namespace of the leader Lease and the raygate-config ConfigMap (default: $POD_NAMESPACE or "
        "%(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (default: %(default)s)")
    add_arguments(p)
    p.set_defaults(func=run, renew_certificates=renew_certificates)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The reconciler's own flags (`raygate reconciler` and `raygate serve`; both add --kubeconfig, --namespace and
    --log-level themselves)."""
    p.add_argument("--metrics-port", type=int, default=8080,
                   help="port for /metrics, /healthz and /readyz; 0 picks a free port (default: %(default)s)")
    p.add_argument("--identity", default=None,
                   help="leader-election identity (default: $POD_NAME, else hostname and a random suffix)")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                   help="elect a leader before acting; --no-leader-elect runs alone (default: on)")
    p.add_argument("--lease-duration", type=_positive, default=15.0,
                   help="seconds a standby waits after the last renewal before taking over (default: %(default)s)")
    p.add_argument("--renew-deadline", type=_positive, default=10.0,
                   help="seconds the leader keeps trying to renew before it gives up leading (default: %(default)s)")
    p.add_argument("--retry-period", type=_positive, default=2.0,
                   help="seconds between lease acquire and renew attempts (default: %(default)s)")
    # A job's first reconcile is four writes in a row; 64 in flight keep pace with a burst of creates from
    # 16 clients (benchmarks: create -> request p99 1.4 s for 1,000 jobs, 13 s with 16 workers).
    p.add_argument("--workers", type=_count, default=64, help="jobs reconciled in parallel (default: %(default)s)")
    p.add_argument("--resync-seconds", type=_positive, default=300.0,
                   help="seconds between full passes over every cached job (default: %(default)s)")
    p.add_argument("--pod-batch-seconds", type=_seconds, default=BATCH_SECONDS,
                   help="a job whose pods changed is reconciled this long after the first change, with every change "
                   "until then: a gang's pods are released in a few reconciles, not one per pod event; 0 reconciles "
                   "on each (default: %(default)s)")
    p.add_argument("--pod-batch-max-seconds", type=_seconds, default=None,
                   help="wait instead until a job's pods have been quiet for --pod-batch-seconds, at most this long "
                   "(default: no quiet wait; a worker group's pods are released together anyway, once KubeRay has "
                   "made as many as its spec asks for, or 5 s after the newest came)")
    p.add_argument("--as", dest="impersonate", default=None, metavar="USER",
                   help="act as USER through impersonation, e.g. system:serviceaccount:raygate-system:"
                   "raygate-reconciler when run outside the cluster with admin credentials, so that RBAC and the "
                   "webhook's trusted-user guard apply as in a real install")
    p.add_argument("--manage-certs", action=argparse.BooleanOptionalAction, default=True,
                   help="renew the webhook certificate before it expires (`certs ensure` hourly); "
                   "--no-manage-certs when cert-manager owns it (default: on)")


def run(args: argparse.Namespace) -> int:
    """`raygate reconciler`: until SIGTERM or SIGINT."""
    from raygate.core import logs

    timing = lease_timing(args)
    logs.setup(args.log_level)
    run_until(args, timing, _stop_on_signals())
    return 0


def lease_timing(args: argparse.Namespace) -> LeaseTiming:
    """The leader-election flags, checked: a bad combination stops the command before it connects."""
    from raygate.reconciler.leader import LeaseTiming

    try:
        return LeaseTiming(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as err:
        raise RaygateError(f"--lease-duration/--renew-deadline/--retry-period: {err}") from None


def run_until(args: argparse.Namespace, timing: LeaseTiming, stop: threading.Event) -> None:
    """Reconcile (as the leader, unless --no-leader-elect) until `stop` is set; raise RaygateError if the API server
    cannot be reached at start or the Lease is lost."""
    kube = _connect(args)
    controller, config = _controller(kube, args)
    controller.start_informers()
    housekeeping = _housekeeping(kube, config, args)
    server = _serve_metrics(kube, controller, args.metrics_port)
    identity = args.identity or default_identity()
    log.info("reconciler starting", extra={"identity": identity, "metrics_port": server.server_address[1],
                                           "provisioning_request_version": controller.provreq_version,
                                           "group_kinds": sorted(controller.group_kinds),
                                           "gang_scheduling_version": controller.served.gang_version})
    while not controller.synced() and not stop.wait(0.1):
        pass
    config.loaded.wait(30)
    try:
        if args.leader_elect:
            _lead(kube, controller, args.namespace, identity, timing, stop)  # stops the controller
        else:
            controller.start_workers()
            stop.wait()
            controller.stop()
    finally:
        housekeeping.stop()
        server.shutdown()
    log.info("reconciler stopped", extra={"identity": identity})


class InWorker:
    """The reconciler on a thread of the process that serves the webhook (`raygate serve`), as Kueue's controller
    runs its reconcilers beside its webhooks. The webhook's server starts it once its worker has loaded the app,
    and stops it when the worker exits; if the reconciler ends on its own (the Lease lost, the API server not
    reachable at start), `exit_worker` ends the worker, whose master starts a fresh one, a clean standby."""

    # Imported in the webhook's master before it forks its worker, which then shares those pages with it.
    MODULES: tuple[str, ...] = ("raygate.reconciler.controller", "raygate.reconciler.housekeeping",
                                "raygate.reconciler.leader")

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.timing = lease_timing(args)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, exit_worker: Callable[[], None]) -> None:
        def body() -> None:
            try:
                run_until(self.args, self.timing, self._stop)
            except RaygateError as err:
                log.error("the reconciler stopped; restarting the worker", extra={"error": str(err)})
            except Exception:
                log.exception("the reconciler failed; restarting the worker")
            if not self._stop.is_set():
                exit_worker()

        self._thread = threading.Thread(target=body, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Finish in-flight reconciles and give up the Lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def _connect(args: argparse.Namespace) -> Kube:
    from raygate.kube.client import Kube
    from raygate.reconciler import metrics

    # One connection per worker, plus the watches, Event senders, Lease and housekeeping: a pool that is
    # too small discards connections, and every new one costs the API server a TLS handshake.
    # Twice the workers: a worker creates a job's PodTemplates side by side.
    kube = Kube.connect(args.kubeconfig, user_agent="raygate-reconciler", pool_size=2 * args.workers + 16)
    kube.impersonate = args.impersonate
    kube.observe = metrics.observe_api_request
    return kube


def _controller(kube: Kube, args: argparse.Namespace) -> tuple[Controller, ConfigSource]:
    from raygate.kube import discovery
    from raygate.kube.client import ApiError
    from raygate.kube.configsource import ConfigSource
    from raygate.reconciler.controller import Controller, Options

    try:
        served = discovery.served(kube)  # the config is checked against what the controller can create
        config = ConfigSource(kube, args.namespace, served=served).start()
        options = Options(workers=args.workers, resync_seconds=args.resync_seconds,
                          pod_batch_seconds=args.pod_batch_seconds, pod_batch_max_seconds=args.pod_batch_max_seconds)
        return Controller(kube, config, options, served=served), config
    except ApiError as err:
        raise RaygateError(f"cannot reach the API server at {kube.host}: {err}") from None


def _housekeeping(kube: Kube, config: ConfigSource, args: argparse.Namespace) -> Housekeeping:
    from raygate.reconciler.housekeeping import Housekeeping

    renewal: CertificateRenewal | None = args.renew_certificates if args.manage_certs else None
    return Housekeeping(
        kube, config,
        renew_certificates=None if renewal is None else (
            lambda stop: renewal(args.kubeconfig, args.impersonate, args.namespace, stop)),
    ).start()


def _serve_metrics(kube: Kube, controller: Controller, port: int) -> ThreadingHTTPServer:
    from prometheus_client import REGISTRY

    from raygate.reconciler import metrics

    server = metrics.serve(port, controller.not_ready)
    REGISTRY.register(metrics.StateCollector(controller.all_jobs, kube, controller.queue.waiting,
                                             controller.queue_metrics))
    return server


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def _lead(kube: Kube, controller: Controller, namespace: str, identity: str, timing: LeaseTiming,
          stop: threading.Event) -> None:
    """Work while holding the Lease; return on stop, and raise once the Lease is lost."""
    from raygate.reconciler.leader import LeaderElector

    elector = LeaderElector(kube, namespace, keys.LEADER_LEASE, identity, timing)
    threading.Thread(target=elector.run, args=(controller.start_workers,), name="leader", daemon=True).start()
    while not stop.wait(0.2) and not elector.lost.is_set():
        pass
    controller.stop()  # in-flight reconciles finish before the Lease is given up
    elector.stop(timing.renew_deadline)  # as client-go releases once its renew loop has returned
    if elector.lost.is_set():
        # Another replica may be acting now: exit so the Deployment restarts us as a clean standby.
        raise RaygateError("lost the leader lease; exiting so that only one reconciler acts")
    elector.release()
