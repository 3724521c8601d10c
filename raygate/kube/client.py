"""A small raw-JSON Kubernetes client over urllib3.

Credentials come from raygate.kube.credentials (a service account, a client certificate, a token),
or from the `kubernetes` package where a kubeconfig says more (exec plugins, auth providers). Requests
go straight over urllib3 and are parsed with orjson: the `kubernetes` package's generated models cost
far more CPU and memory than plain dicts, and its watch helper hides resourceVersion and bookmark
handling that a level-triggered controller must own.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import urllib3

from raygate.core.api import Resource
from raygate.core.errors import RaygateError
from raygate.core.objects import JSON

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: Mapping[str, Any] | None, method: str, path: str) -> None:
        self.status = status
        self.body = dict(body or {})
        self.reason = str(self.body.get("reason", ""))
        self.message = str(self.body.get("message", "")) or f"HTTP {status}"
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def conflict(self) -> bool:
        return self.status == 409 and self.reason != "AlreadyExists"

    @property
    def gone(self) -> bool:
        return self.status == 410


TOO_MANY_REQUESTS_RETRIES = 5


def _retry_after(header: str | None) -> float:
    """Seconds to wait for a 429's Retry-After (whole seconds), within [0.1, 5]; 1 when absent."""
    try:
        return min(max(float(header), 0.1), 5.0) if header else 1.0
    except ValueError:
        return 1.0


IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def context_namespace(kubeconfig: str | None) -> str:
    """The namespace a command acts in by default: the pod's own, else the kubeconfig context's."""
    from kubernetes import config

    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST") and Path(IN_CLUSTER_NAMESPACE).is_file():
        return Path(IN_CLUSTER_NAMESPACE).read_text().strip() or "default"
    try:
        _, current = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, ValueError):
        return "default"
    ns = (current or {}).get("context", {}).get("namespace")
    return str(ns) if ns else "default"


class Kube:
    """Authenticated JSON requests against one API server; counts requests by method."""

    def __init__(self, configuration: Any, *, user_agent: str = "raygate", pool_size: int = 8) -> None:
        self._conf = configuration
        self.host = str(configuration.host).rstrip("/")
        kwargs: dict[str, Any] = {"maxsize": pool_size, "retries": False}
        if self.host.startswith("https"):
            kwargs["cert_reqs"] = "CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE"
            if configuration.ssl_ca_cert:
                kwargs["ca_certs"] = configuration.ssl_ca_cert
            if configuration.cert_file:
                kwargs["cert_file"] = configuration.cert_file
                kwargs["key_file"] = configuration.key_file
        self._http = urllib3.PoolManager(**kwargs)
        self._user_agent = user_agent
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.impersonate: str | None = None
        # Told (method, seconds) after each answered request, watches apart: the reconciler's latency metric.
        self.observe: Callable[[str, float], None] | None = None

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, user_agent: str = "raygate", pool_size: int = 8) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig (or $KUBECONFIG).

        Read by raygate.kube.credentials where they are a service account, a client certificate or a token;
        by the `kubernetes` package (imported only then) where a kubeconfig says more."""
        from raygate.kube import credentials

        try:
            found = credentials.load(kubeconfig)
        except credentials.CredentialsError as err:
            raise RaygateError(f"cannot load the Kubernetes configuration: {err}") from None
        if found is not None:
            return cls(found, user_agent=user_agent, pool_size=pool_size)
        from kubernetes import client, config

        conf = client.Configuration()
        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=conf)  # type: ignore[no-untyped-call]
            else:
                try:
                    config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
                except config.ConfigException:
                    config.load_kube_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError, TypeError, ValueError) as err:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "the in-cluster service account or ~/.kube/config"
            raise RaygateError(
                f"cannot load the Kubernetes configuration from {where}: {err}; pass --kubeconfig PATH or set "
                "KUBECONFIG"
            ) from None
        return cls(conf, user_agent=user_agent, pool_size=pool_size)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self._user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        for setting in self._conf.auth_settings().values():  # refreshes in-cluster tokens
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        if self.impersonate:
            headers["Impersonate-User"] = self.impersonate
        return headers

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        q = {k: ("true" if v is True else "false" if v is False else v) for k, v in (query or {}).items()
             if v is not None}
        return self.host + path + (("?" + urlencode(q)) if q else "")

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30.0,
    ) -> JSON:
        data = orjson.dumps(body) if body is not None and not isinstance(body, bytes) else body
        if data is not None and content_type is None:
            content_type = "application/json"
        for attempt in range(TOO_MANY_REQUESTS_RETRIES + 1):
            with self._lock:
                self.requests[method] += 1
            started = time.monotonic()
            try:
                resp = self._http.request(
                    method, self._url(path, query), body=data, headers=self._headers(content_type),
                    timeout=urllib3.Timeout(connect=5.0, read=timeout), preload_content=True,
                )
            except urllib3.exceptions.HTTPError as err:
                raise ApiError(0, {"reason": "ConnectionError", "message": str(err)}, method, path) from None
            if self.observe is not None:
                self.observe(method, time.monotonic() - started)
            # 429 means the API server did not handle the request (a CRD's storage still starting,
            # priority and fairness shedding load); like client-go, wait as told and send it again.
            if resp.status != 429 or attempt == TOO_MANY_REQUESTS_RETRIES:
                break
            time.sleep(_retry_after(resp.headers.get("Retry-After")))
        try:
            parsed = orjson.loads(resp.data) if resp.data else {}
        except orjson.JSONDecodeError:
            parsed = {"message": resp.data[:300].decode(errors="replace")}
        if resp.status >= 400:
            raise ApiError(resp.status, parsed if isinstance(parsed, dict) else {}, method, path)
        return parsed if isinstance(parsed, dict) else {}

    @property
    def writes(self) -> int:
        return sum(n for m, n in self.requests.items() if m in WRITE_METHODS)

    # --- verbs -------------------------------------------------------------------------------
    def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        return self.request("GET", res.path(namespace, name))

    def list(self, res: Resource, namespace: str | None = None, **query: Any) -> JSON:
        return self.request("GET", res.path(namespace), query=query)

    def create(self, res: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> JSON:
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        return self.request("POST", res.path(namespace), body=body, query={"fieldManager": "raygate"})

    def patch(
        self, res: Resource, name: str, patch: Any, namespace: str | None = None, *,
        content_type: str = MERGE_PATCH, sub: str | None = None,
    ) -> JSON:
        return self.request(
            "PATCH", res.path(namespace, name, sub), body=patch, content_type=content_type,
            query={"fieldManager": "raygate"},
        )

    def replace(self, res: Resource, name: str, obj: Mapping[str, Any], namespace: str | None = None) -> JSON:
        return self.request("PUT", res.path(namespace, name), body=obj, query={"fieldManager": "raygate"})

    def delete(self, res: Resource, name: str, namespace: str | None = None, *, missing_ok: bool = True,
               propagation: str = "Background") -> None:
        try:
            self.request("DELETE", res.path(namespace, name), body={"propagationPolicy": propagation})
        except ApiError as err:
            if not (missing_ok and err.not_found):
                raise

    def served(self, group: str, version: str) -> bool:
        try:
            self.request("GET", f"/apis/{group}/{version}")
        except ApiError as err:
            if err.not_found:
                return False
            raise
        return True

    def watch(self, res: Resource, namespace: str | None = None, *, timeout_seconds: int = 300,
              **query: Any) -> Iterator[JSON]:
        """Stream watch events (dicts with type and object) until the server ends the watch."""
        q = {"watch": True, "allowWatchBookmarks": True, "timeoutSeconds": timeout_seconds, **query}
        with self._lock:
            self.requests["WATCH"] += 1
        try:
            resp = self._http.request(
                "GET", self._url(res.path(namespace), q), headers=self._headers(None),
                timeout=urllib3.Timeout(connect=5.0, read=timeout_seconds + 30), preload_content=False,
            )
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, {"reason": "ConnectionError", "message": str(err)}, "WATCH", res.path(namespace)) \
                from None
        try:
            if resp.status >= 400:
                raise ApiError(resp.status, orjson.loads(resp.read() or b"{}"), "WATCH", res.path(namespace))
            buf = b""
            for chunk in resp.stream(64 * 1024, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield orjson.loads(line)
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, {"reason": "ConnectionError", "message": str(err)}, "WATCH", res.path(namespace)) \
                from None
        finally:
            resp.release_conn()
