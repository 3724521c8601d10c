"""Kubernetes objects as plain dicts: reading fields, metadata and owner references.

Every layer reads objects the same way through these, so none of them rewrites its own helpers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

JSON = dict[str, Any]  # a Kubernetes object as the API server sends it
Path = tuple[str | int, ...]


class Key(NamedTuple):
    """A namespaced object by kind and name: a RayJob or RayCluster raygate holds, or a pod it places."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> Key | None:
        """The key str() wrote ("Kind namespace/name"), or None."""
        kind, _, rest = text.partition(" ")
        namespace, _, name = rest.partition("/")
        return cls(kind, namespace, name) if kind and namespace and name else None


class PodKey(NamedTuple):
    namespace: str
    name: str


def get(obj: Any, path: Path, default: Any = None) -> Any:
    cur = obj
    for part in path:
        if type(cur) is dict and type(part) is str:  # the common case, without the slower ABC check below
            if part not in cur:
                return default
        elif isinstance(part, int):
            if not isinstance(cur, list) or part >= len(cur):
                return default
        elif not isinstance(cur, Mapping) or part not in cur:
            return default
        cur = cur[part]
    return cur


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """`metadata`, or an empty mapping when it is missing or not an object."""
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


def meta_str(obj: Mapping[str, Any], field: str) -> str:
    """A metadata field as a string ("" when absent): name, namespace, uid, resourceVersion."""
    return str(metadata(obj).get(field) or "")


def string_map(value: Any) -> dict[str, str]:
    """Labels or annotations as strings; anything that is not a mapping is empty."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return string_map(metadata(obj).get("labels"))


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference marked controller: true, if any."""
    refs = metadata(obj).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controller (for raygate's children: the owning job), if any."""
    ref = controller_ref(obj)
    return str(ref.get("uid") or "") or None if ref is not None else None


def with_kind(obj: JSON, kind: str, api_version: str) -> JSON:
    """`obj` with kind and apiVersion set: list items and watch events of typed lists arrive without them."""
    if "kind" in obj and "apiVersion" in obj:
        return obj
    return {**obj, "kind": obj.get("kind") or kind, "apiVersion": obj.get("apiVersion") or api_version}
