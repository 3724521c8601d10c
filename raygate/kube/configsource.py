"""The live config: watched from ConfigMap raygate-config and hot-reloaded.

An invalid new version is rejected field by field (a log line, a Warning Event on the ConfigMap,
a metric) and the last good config keeps serving. A missing ConfigMap means the defaults.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from raygate.core import keys
from raygate.core.api import CONFIGMAPS, OFFLINE, Served
from raygate.core.config import parse_config
from raygate.core.objects import JSON, meta_str
from raygate.core.policy import DEFAULT_CONFIG, ConfigError, RaygateConfig
from raygate.kube import events
from raygate.kube.client import Kube
from raygate.kube.informer import Informer

log = logging.getLogger("raygate.config")


class ConfigSource:
    def __init__(self, kube: Kube | None, namespace: str = keys.SYSTEM_NAMESPACE,
                 on_result: Callable[[list[str]], None] | None = None, served: Served = OFFLINE) -> None:
        """`served`: what the cluster serves, as the component found at start: a config whose mode the cluster
        cannot run (native mode without Kubernetes' gang scheduling) is rejected like any invalid one."""
        self.kube = kube
        self.served = served
        self.namespace = namespace
        self._config = DEFAULT_CONFIG
        self.loaded = threading.Event()
        self.last_error: list[str] = []
        self.generation = 0
        self.seen_version = ""  # resourceVersion of the newest ConfigMap version handled, good or bad
        self._on_result = on_result  # called with the problems, [] when a version was accepted
        self._informer: Informer | None = None
        self._listeners: list[Callable[[], None]] = []

    def on_loaded(self, listener: Callable[[], None]) -> None:
        """Call `listener` (no arguments) after every new config is swapped in."""
        self._listeners.append(listener)

    @property
    def config(self) -> RaygateConfig:
        return self._config  # swapped atomically; readers never see a half-built config

    def start(self) -> ConfigSource:
        if self.kube is None:
            self.loaded.set()
            return self
        self._informer = Informer(
            self.kube, CONFIGMAPS, namespace=self.namespace,
            field_selector=f"metadata.name={keys.CONFIGMAP_NAME}", handler=self._on_event,
        ).start()
        self._informer.synced.wait(30)
        if self._informer.synced.is_set() and not self._informer.items():
            self.loaded.set()  # no ConfigMap: the defaults are the config
        return self

    def set_text(self, text: str, source: JSON | None = None) -> bool:
        """Validate and swap in a new config; keep the old one when it is invalid."""
        try:
            cfg = parse_config(text, self.served)
        except ConfigError as err:
            self.last_error = err.problems
            log.error("config rejected; the last good config keeps serving",
                      extra={"configmap": f"{self.namespace}/{keys.CONFIGMAP_NAME}", "problems": err.problems})
            if self._on_result:
                self._on_result(err.problems)
            if source is not None and self.kube is not None:
                rv = meta_str(source, "resourceVersion") or "0"
                events.record(
                    self.kube, {**source, "apiVersion": "v1", "kind": "ConfigMap"}, "InvalidConfig",
                    "raygate-config rejected, the previous config stays in force: " + "; ".join(err.problems),
                    warning=True, name=f"{keys.CONFIGMAP_NAME}.invalid.{rv}",
                )
            return False
        self._config = cfg
        self.last_error = []
        if self._on_result:
            self._on_result([])
        self.generation += 1
        log.info("config loaded", extra={"configmap": f"{self.namespace}/{keys.CONFIGMAP_NAME}",
                                         "generation": self.generation})
        for listener in self._listeners:
            listener()
        return True

    def _on_event(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            log.warning("config deleted; keeping the last good config")
            return
        self.set_text(str((obj.get("data") or {}).get(keys.CONFIGMAP_KEY, "")), obj)
        self.seen_version = meta_str(obj, "resourceVersion")
        self.loaded.set()  # even a rejected first version counts: the defaults then serve
