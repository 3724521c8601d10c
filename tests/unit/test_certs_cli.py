"""`raygate certs`: argument parsing, help, and one-line errors that need no cluster."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import socket
from pathlib import Path

import pytest

from raygate.certs.cli import parse_duration
from raygate.cli import main


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("720h", dt.timedelta(hours=720)),
        ("30d", dt.timedelta(days=30)),
        ("1h30m", dt.timedelta(minutes=90)),
        ("90s", dt.timedelta(seconds=90)),
        ("1.5h", dt.timedelta(minutes=90)),
        ("2d12h", dt.timedelta(hours=60)),
    ],
)
def test_parse_duration(text: str, expected: dt.timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "720", "h", "30 days", "1h-5m", "3w"])
def test_parse_duration_refuses_garbage(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["certs", "--help"], ["ensure", "show"]),
        (["certs", "ensure", "--help"], ["--renew-before", "--extra-san", "--out-dir", "--kubeconfig",
                                         "--skip-missing-webhooks", "raygate-system", "raygate-webhook-tls"]),
        (["certs", "show", "--help"], ["--namespace", "--secret", "--dir"]),
    ],
)
def test_help(argv: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for word in expected:
        assert word in out


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("raygate: error: "), err
    return err


def test_renew_before_longer_than_the_validity_is_refused_before_any_api_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["certs", "ensure", "--renew-before", "9000h", "--kubeconfig", "/nonexistent"]) == 1
    assert "must be longer than renew-before" in error_line(capsys)


def test_bad_extra_san_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "ensure", "--extra-san", "not a name", "--kubeconfig", "/nonexistent"]) == 1
    assert "'not a name' is neither an IP address nor a valid DNS name" in error_line(capsys)


def test_missing_kubeconfig_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "ensure", "--kubeconfig", "/nonexistent/kubeconfig"]) == 1
    assert "cannot load the Kubernetes configuration from /nonexistent/kubeconfig" in error_line(capsys)


def test_unreachable_api_server_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))
    assert main(["certs", "show", "--kubeconfig", str(kubeconfig)]) == 1
    assert f"cannot reach the API server at https://127.0.0.1:{port}" in error_line(capsys)


def test_show_from_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from raygate.certs.rotation import Action, Decision, Policy, issue, service_sans
    from raygate.certs.store import write_files

    now = dt.datetime.now(dt.UTC)
    sans = service_sans("raygate-webhook", "raygate-system", ["127.0.0.1"])
    material = issue(Decision(Action.REGENERATE, "t"), None, common_name="raygate-webhook.raygate-system.svc",
                     ca_name="ca", sans=sans, now=now, policy=Policy())
    write_files(tmp_path, material)
    assert main(["certs", "show", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "subject:" in out and "CN=raygate-webhook.raygate-system.svc" in out
    assert "raygate-webhook.raygate-system.svc.cluster.local, 127.0.0.1" in out
    days = next(line for line in out.splitlines() if line.startswith("days left:"))
    assert 364.0 <= float(days.split()[-1]) <= 365.0


def test_show_from_an_empty_directory_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "show", "--dir", str(tmp_path)]) == 1
    assert "holds no readable tls.crt" in error_line(capsys)


def test_the_renewal_loop_runs_certs_ensure_as_a_child_and_logs_why_it_failed() -> None:
    """The reconciler's renewal: `raygate certs ensure` in a child process; a failure is logged with the child's
    message and retried."""
    import threading

    from raygate.certs.cli import renew_forever

    stop = threading.Event()
    failures: list[logging.LogRecord] = []

    class Stopper(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "certificate rotation failed":
                failures.append(record)
                if len(failures) == 2:
                    stop.set()

    handler = Stopper()
    logging.getLogger("raygate.certs").addHandler(handler)
    try:
        worker = threading.Thread(target=renew_forever, args=("/nonexistent/kubeconfig", None, "ns", stop),
                                  kwargs={"retry_interval": 0.01}, daemon=True)
        worker.start()
        worker.join(60)
    finally:
        logging.getLogger("raygate.certs").removeHandler(handler)
    assert not worker.is_alive() and len(failures) == 2, "a failure is retried, and the loop ends on stop"
    assert "cannot load the Kubernetes configuration from /nonexistent/kubeconfig" in str(failures[0].__dict__["error"])
