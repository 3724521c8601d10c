"""`raygate serve` takes the webhook's flags and the reconciler's on one command line, and refuses a bad lease
timing before it serves anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from raygate.cli import build_parser, main


def test_serve_takes_the_webhooks_and_the_reconcilers_flags() -> None:
    args = build_parser().parse_args(["serve", "--tls-cert-file", "c", "--tls-key-file", "k", "--threads", "2",
                                      "--metrics-port", "0", "--workers", "16", "--no-manage-certs",
                                      "--pod-batch-seconds", "0.5", "--namespace", "ns"])
    assert (args.threads, args.metrics_port, args.workers, args.manage_certs, args.pod_batch_seconds,
            args.namespace) == (2, 0, 16, False, 0.5, "ns")
    assert args.renew_certificates is not None  # the certs component's renewal, wired in as for `reconciler`


def test_a_bad_lease_timing_stops_serve_before_it_serves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    assert main(["serve", "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--lease-duration", "2",
                 "--renew-deadline", "3"]) == 1
    assert "--lease-duration/--renew-deadline/--retry-period" in capsys.readouterr().err
