"""Turn API failures into one actionable line: unreachable server, bad credentials, missing RBAC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import urllib3
from kubernetes.client.exceptions import ApiException

from raygate.core.errors import RaygateError


def server_message(exc: ApiException) -> str:
    """The Status message the API server sent, else the HTTP reason."""
    try:
        message = json.loads(exc.body or "")["message"]
    except (ValueError, TypeError, KeyError):
        message = None
    return str(message or exc.reason or "no details")


def _describe(exc: ApiException, verb: str, resource: str, namespace: str | None, host: str) -> str:
    where = f" in namespace {namespace}" if namespace else " (cluster-scoped)"
    if not exc.status:  # the client reports TLS failures as status 0
        return f"cannot reach the API server at {host}: {exc.reason}"
    if exc.status == 401:
        return f"the API server at {host} rejected the credentials: check the kubeconfig or service account token"
    if exc.status == 403:
        return (
            f"no permission to {verb} {resource}{where}: grant the verb {verb!r} on {resource!r} "
            f"to this user or service account ({server_message(exc)})"
        )
    return f"{verb} {resource}{where} failed with HTTP {exc.status}: {server_message(exc)}"


@contextmanager
def api_errors(verb: str, resource: str, namespace: str | None, host: str) -> Iterator[None]:
    """Re-raise API and connection failures inside the block as RaygateError naming verb and resource.

    Statuses the caller expects (404, 409) must be caught inside the block first.
    """
    try:
        yield
    except ApiException as exc:
        raise RaygateError(_describe(exc, verb, resource, namespace, host)) from exc
    except urllib3.exceptions.HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise RaygateError(f"cannot reach the API server at {host}: {reason}") from exc
