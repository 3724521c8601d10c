"""Polling for what the cluster does eventually (controllers, watches, Events)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Call `check` until it returns something truthy and return that; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def consistently(check: Callable[[], Any], seconds: float, what: str, interval: float = 0.25,
                 explain: Callable[[], str] | None = None) -> None:
    """`check` stays truthy for `seconds`: what must not happen does not, even after a while."""
    deadline = time.monotonic() + seconds
    while True:
        if not check():
            raise AssertionError(f"expected {what}" + (f": {explain()}" if explain else ""))
        if time.monotonic() > deadline:
            return
        time.sleep(interval)
