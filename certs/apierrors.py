"""Turn API failures into one actionable line: unreachable server, bad credentials, missing RBAC."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from raygate.core.errors import RaygateError
from raygate.kube.client import ApiError


def _describe(err: ApiError, verb: str, resource: str, namespace: str | None, host: str) -> str:
    where = f" in namespace {namespace}" if namespace else " (cluster-scoped)"
    if not err.status:  # the client reports connection and TLS failures as status 0
        return f"cannot reach the API server at {host}: {err.message}"
    if err.status == 401:
        return f"the API server at {host} rejected the credentials: check the kubeconfig or service account token"
    if err.status == 403:
        return (
            f"no permission to {verb} {resource}{where}: grant the verb {verb!r} on {resource!r} "
            f"to this user or service account ({err.message})"
        )
    return f"{verb} {resource}{where} failed with HTTP {err.status}: {err.message}"


@contextmanager
def api_errors(verb: str, resource: str, namespace: str | None, host: str) -> Iterator[None]:
    """Re-raise API and connection failures inside the block as RaygateError naming verb and resource.

    Statuses the caller expects (404, 409) must be caught inside the block first.
    """
    try:
        yield
    except ApiError as err:
        raise RaygateError(_describe(err, verb, resource, namespace, host)) from err
