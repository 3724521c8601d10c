"""Timestamps as Kubernetes writes them (RFC 3339 in UTC, with a Z), written and read one way."""

from __future__ import annotations

import datetime as dt


def timestamp(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def precise_timestamp(t: dt.datetime) -> str:
    """Milliseconds, so a backoff of a second or two is not cut short by rounding."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_time(text: object) -> dt.datetime | None:
    """A timestamp as the API server or raygate wrote it, timezone-aware (UTC where it names no zone, so it
    compares with now); None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)
