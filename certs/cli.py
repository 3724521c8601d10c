"""`raygate certs ensure | show`: create, renew and inspect the webhook's certificates."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from raygate.core.errors import RaygateError
from raygate.core.keys import (
    MUTATING_WEBHOOK_CONFIG,
    SYSTEM_NAMESPACE,
    TLS_SECRET,
    VALIDATING_WEBHOOK_CONFIG,
    WEBHOOK_SERVICE,
)

if TYPE_CHECKING:
    from raygate.kube.client import Kube

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration(text: str) -> dt.timedelta:
    """Go-style durations as Kubernetes tools write them (720h, 1h30m, 90s), plus days (30d)."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 720h, 30d or 1h30m")
    return dt.timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = subparsers.add_parser(
        "certs",
        help="manage the webhook certificates",
        description="The webhook's CA and serving certificate: stored in a Secret, trusted through the "
        "caBundle of the webhook configurations, renewed before they expire.",
    )
    sub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    ensure = sub.add_parser(
        "ensure",
        help="create or renew the certificates and inject the caBundle (does nothing when all is valid)",
        description="Create the CA and serving certificate when missing, renew them inside the renewal "
        "window or when the names changed, and write the CA into every webhook of the webhook "
        "configurations. Safe to run repeatedly and concurrently.",
    )
    _common(ensure)
    ensure.add_argument("--service", default=WEBHOOK_SERVICE, help=f"webhook Service name (default: {WEBHOOK_SERVICE})")
    ensure.add_argument(
        "--renew-before", type=parse_duration, default=dt.timedelta(hours=720), metavar="DURATION",
        help="renew when a certificate expires within this (default: 720h)",
    )
    ensure.add_argument(
        "--serving-validity", type=parse_duration, default=dt.timedelta(hours=8760), metavar="DURATION",
        help="lifetime of a new serving certificate (default: 8760h, one year)",
    )
    ensure.add_argument(
        "--ca-validity", type=parse_duration, default=dt.timedelta(hours=87600), metavar="DURATION",
        help="lifetime of a new CA (default: 87600h, ten years)",
    )
    ensure.add_argument(
        "--extra-san", action="append", default=[], metavar="NAME",
        help="another DNS name or IP address for the serving certificate (repeatable), e.g. 127.0.0.1",
    )
    ensure.add_argument(
        "--out-dir", type=Path, default=None, metavar="DIR",
        help="also write ca.crt, tls.crt and tls.key here (a webhook running as a local process)",
    )
    ensure.add_argument(
        "--mutating-webhook", default=MUTATING_WEBHOOK_CONFIG, metavar="NAME",
        help=f"MutatingWebhookConfiguration to inject into (default: {MUTATING_WEBHOOK_CONFIG}; '' for none)",
    )
    ensure.add_argument(
        "--validating-webhook", default=VALIDATING_WEBHOOK_CONFIG, metavar="NAME",
        help=f"ValidatingWebhookConfiguration to inject into (default: {VALIDATING_WEBHOOK_CONFIG}; '' for none)",
    )
    ensure.add_argument(
        "--skip-missing-webhooks", action="store_true",
        help="log and go on when a webhook configuration does not exist, instead of failing",
    )
    ensure.set_defaults(func=_ensure)

    show = sub.add_parser(
        "show",
        help="print the serving certificate's subject, SANs and expiry",
        description="Print subject, issuer, SANs, notAfter and days left of the serving certificate "
        "in the Secret (or in a directory written by `ensure --out-dir`).",
    )
    _common(show)
    show.add_argument("--dir", type=Path, default=None, help="read tls.crt and ca.crt from this directory instead")
    show.set_defaults(func=_show)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace", "-n", default=SYSTEM_NAMESPACE, help=f"namespace of the Secret (default: {SYSTEM_NAMESPACE})"
    )
    parser.add_argument("--secret", default=TLS_SECRET, help=f"the TLS Secret (default: {TLS_SECRET})")
    parser.add_argument(
        "--kubeconfig", default=None, metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account)",
    )
    parser.add_argument("--as", dest="impersonate", default=None, metavar="USER",
                        help="act as USER through impersonation (the reconciler passes its own --as)")


def connect(kubeconfig: str | None, impersonate: str | None = None) -> Kube:
    """raygate's one Kubernetes client: `kubeconfig`, else in-cluster, else $KUBECONFIG or ~/.kube/config."""
    from raygate.kube.client import Kube

    kube = Kube.connect(kubeconfig, user_agent="raygate-certs")
    kube.impersonate = impersonate
    return kube


def renew_forever(kubeconfig: str | None, impersonate: str | None, namespace: str, stop_event: threading.Event,
                  *, interval: float = 3600.0, retry_interval: float = 60.0) -> None:
    """Keep the webhook certificate in `namespace` valid until `stop_event` is set: `raygate certs ensure` as the
    reconciler's child process, hourly (every `retry_interval` seconds after a failure: an outage or RBAC).

    A child, not a call: the X.509 work needs `cryptography`, which costs the process that imports it about 9 MB
    for good (docs/benchmarks.md, the whole footprint), for a few hundred milliseconds of work an hour. The child
    connects as the reconciler does (its kubeconfig or service account, and its `--as`)."""
    import logging
    import subprocess
    import sys

    log = logging.getLogger("raygate.certs")
    command = [sys.executable, "-m", "raygate", "certs", "ensure", "--namespace", namespace,
               *(["--kubeconfig", kubeconfig] if kubeconfig else []), *(["--as", impersonate] if impersonate else [])]
    while not stop_event.is_set():
        wait = interval
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
            failed = done.returncode != 0
            output = (done.stderr if failed else done.stdout).strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            failed, output = True, str(err)
        if failed:
            log.error("certificate rotation failed", extra={"namespace": namespace, "error": output[-2000:],
                                                            "retry_in_seconds": retry_interval})
            wait = retry_interval
        else:  # hourly "unchanged" runs would drown the log at info level
            log.log(logging.DEBUG if output.startswith("unchanged") else logging.INFO, "certificates ensured",
                    extra={"namespace": namespace, "summary": output[-2000:]})
        stop_event.wait(wait)


def _ensure(args: argparse.Namespace) -> int:
    from raygate.certs.ensure import Spec, ensure
    from raygate.certs.inject import WebhookConfigs

    spec = Spec(
        namespace=args.namespace,
        service=args.service,
        secret=args.secret,
        renew_before=args.renew_before,
        ca_validity=args.ca_validity,
        serving_validity=args.serving_validity,
        extra_sans=tuple(args.extra_san),
        webhook_configs=WebhookConfigs(
            mutating=args.mutating_webhook or None,
            validating=args.validating_webhook or None,
            skip_missing=args.skip_missing_webhooks,
        ),
        out_dir=args.out_dir,
    )
    result = ensure(connect(args.kubeconfig, args.impersonate), spec)
    print(result.summary(dt.datetime.now(dt.UTC)))
    return 0


def _show(args: argparse.Namespace) -> int:
    from raygate.certs.store import read_files, read_secret
    from raygate.core.pki import describe

    if args.dir is not None:
        stored, source = read_files(args.dir), f"directory {args.dir}"
    else:
        loaded = read_secret(connect(args.kubeconfig, args.impersonate), args.namespace, args.secret)
        if not loaded.exists:
            raise RaygateError(
                f"Secret {args.namespace}/{args.secret} does not exist: run `raygate certs ensure`"
            )
        stored, source = loaded.stored, f"Secret {args.namespace}/{args.secret}"
    serving, ca = describe(stored.tls_cert), describe(stored.ca_cert)
    if serving is None:
        raise RaygateError(f"{source} holds no readable tls.crt: run `raygate certs ensure` to replace it")
    now = dt.datetime.now(dt.UTC)
    rows = [
        ("source", source),
        ("subject", serving.subject),
        ("issuer", serving.issuer),
        ("SANs", ", ".join(serving.sans) or "none"),
        ("notBefore", f"{serving.not_before:%Y-%m-%dT%H:%M:%SZ}"),
        ("notAfter", f"{serving.not_after:%Y-%m-%dT%H:%M:%SZ}"),
        ("days left", f"{serving.left(now).total_seconds() / 86400:.1f}"),
        ("serial", f"{serving.serial:x}"),
    ]
    if ca is not None:
        rows.append(("CA notAfter", f"{ca.not_after:%Y-%m-%dT%H:%M:%SZ} ({ca.subject})"))
    width = max(len(k) for k, _ in rows) + 1
    for key, value in rows:
        print(f"{key + ':':<{width}} {value}")
    return 0
