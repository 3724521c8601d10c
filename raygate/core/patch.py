"""Build JSON Patch operations directly (about 2 µs a review, where diffing costs ~0.4 ms).

`set` creates missing parents in one `add` and records them, so later keys under the same new
parent go into that value instead of into extra operations. A value already in place emits nothing,
which keeps re-invocation patch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raygate.core.objects import Path, get

PatchOp = dict[str, Any]


def pointer(path: Path) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


_MISSING = object()


class PatchBuilder:
    def __init__(self, obj: Mapping[str, Any]) -> None:
        self._obj = obj
        self._created: dict[Path, dict[str, Any]] = {}
        self._written: set[Path] = set()
        self.ops: list[PatchOp] = []

    def written(self, path: Path) -> bool:
        """Whether `set` was called for `path` (even when the value was already in place)."""
        return path in self._written

    def _lookup(self, path: Path) -> Any:
        for i in range(len(path), 0, -1):
            created = self._created.get(path[:i])
            if created is not None:
                return get(created, path[i:], _MISSING)
        return get(self._obj, path, _MISSING)

    def set(self, path: Path, value: Any) -> None:
        self._written.add(path)
        if self._lookup(path) == value:
            return
        # The deepest ancestor that already exists as an object (depth 0 is the root).
        depth = len(path) - 1
        while depth > 0 and not isinstance(self._lookup(path[:depth]), Mapping):
            depth -= 1
        nested: Any = value
        for key in reversed(path[depth + 1 :]):
            nested = {key: nested}
        parent_path, key = path[:depth], path[depth]
        created_parent = self._created.get(parent_path)
        if created_parent is not None:
            created_parent[str(key)] = nested
        else:
            self.ops.append({"op": "add", "path": pointer((*parent_path, key)), "value": nested})
        self._remember((*parent_path, key), nested)

    def remove(self, path: Path) -> None:
        """Remove a key that exists in the original object (a no-op when it is absent)."""
        if get(self._obj, path, _MISSING) is _MISSING or any(path[:i] in self._created for i in range(len(path))):
            return
        self.ops.append({"op": "remove", "path": pointer(path)})

    def _remember(self, path: Path, value: Any) -> None:
        """Record each new object, so later keys under it go into this operation's value."""
        if isinstance(value, dict):
            self._created[path] = value
            for k, v in value.items():
                self._remember((*path, k), v)
