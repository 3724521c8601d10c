"""The names raygate gives what it makes: DNS-safe parts, short hashes and content digests, made one way.

Deterministic names are what make the reconciler crash-safe (a restarted reconciler computes the same
name, its create answers AlreadyExists): names made with these are in clusters already, so what each
returns for the same input must never change.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

MAX_NAME = 63  # a DNS-1123 label
_INVALID = re.compile(r"[^a-z0-9-]+")


def short_hash(*parts: str, length: int = 8) -> str:
    """The first `length` hex digits of the SHA-256 of `parts` (joined by NUL: no two splits of one text collide)."""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:length]


def dns(text: str, limit: int) -> str:
    """Lowercase DNS-1123 label characters, at most `limit` long, no dash at either end ("x" when none is left)."""
    return _INVALID.sub("-", text.lower())[:limit].strip("-") or "x"


def digest(obj: Any, length: int = 64) -> str:
    """The first `length` hex digits of the SHA-256 of `obj` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:length]
