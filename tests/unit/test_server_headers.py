"""What a client's headers can change of what the webhook's app sees, under the gunicorn settings `raygate
webhook` runs with: nothing. No peer, loopback included (gunicorn's defaults trust 127.0.0.1), may claim another
scheme, address or script path, and a header gunicorn cannot map to the WSGI environ unambiguously is dropped."""

from __future__ import annotations

from typing import Any

import pytest
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser

from raygate.webhook.server import ServerOptions, WebhookServer

REMOTE, LOOPBACK = ("10.0.0.7", 51234), ("127.0.0.1", 51234)


class _Sock:
    def sendall(self, data: bytes) -> None:  # nothing is sent: only the environ is looked at
        pass


def environ_of(*headers: str, peer: tuple[str, int] = REMOTE) -> dict[str, Any]:
    cfg = WebhookServer(ServerOptions(cert_file="tls.crt", key_file="tls.key")).cfg
    raw = ("POST /mutate HTTP/1.1\r\nHost: raygate-webhook\r\nContent-Length: 2\r\n"
           + "".join(f"{h}\r\n" for h in headers) + "\r\n{}").encode()
    request = next(iter(RequestParser(cfg, iter([raw]), peer)))
    _, environ = wsgi.create(request, _Sock(), peer, ("0.0.0.0", 9443), cfg)
    return environ


def seen(environ: dict[str, Any]) -> tuple[str, str, str, str]:
    return environ["wsgi.url_scheme"], environ["REMOTE_ADDR"], environ["SCRIPT_NAME"], environ["PATH_INFO"]


@pytest.mark.parametrize("peer", [REMOTE, LOOPBACK], ids=["remote", "loopback"])
@pytest.mark.parametrize("header", [
    None, "X-Forwarded-Proto: http", "X-Forwarded-Ssl: off", "X-Forwarded-Protocol: http",
    "X-Forwarded-For: 192.0.2.1", "Forwarded: for=192.0.2.1;proto=http", "Script-Name: /other",
    "Script_Name: /other", "X_Forwarded_Proto: http",
])
def test_no_header_changes_the_scheme_the_address_or_the_path(header: str | None, peer: tuple[str, int]) -> None:
    environ = environ_of(*([header] if header else []), peer=peer)
    assert seen(environ) == ("https", peer[0], "", "/mutate")


def test_a_header_with_an_underscore_is_dropped() -> None:
    """X_Forwarded_For and X-Forwarded-For map to the same environ key: the one with an underscore goes."""
    environ = environ_of("X-Forwarded-For: 192.0.2.1", "X_Forwarded_For: 127.0.0.1", peer=LOOPBACK)
    assert environ["HTTP_X_FORWARDED_FOR"] == "192.0.2.1"
