"""JSON log lines, one per record, naming objects by namespace/name (never whole objects)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from raygate.core.objects import meta_str

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


MAX_FIELD = 4096  # characters of one value in a line: a message may quote what a client sent
_OPTIONS = orjson.OPT_NON_STR_KEYS


class JsonFormatter(logging.Formatter):
    """One JSON line per record, always: a value orjson cannot write (too deep, a huge integer, a
    cycle) is written as its text instead, and every value is cut at MAX_FIELD characters."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            msg = record.getMessage()
        except Exception as err:  # a bad %-format in a call: keep the line, say so
            msg = f"{record.msg!r} (unformattable: {err})"
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _cut(msg),
        }
        line.update({k: _cut(v) if isinstance(v, str) else v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = _cut(self.formatException(record.exc_info), 4 * MAX_FIELD)
        try:
            return orjson.dumps(line, default=_text, option=_OPTIONS).decode()
        except (TypeError, orjson.JSONEncodeError):
            return orjson.dumps({k: v if isinstance(v, str | int | float | bool | None) and not _huge(v) else _text(v)
                                 for k, v in line.items()}).decode()


def _cut(text: str, limit: int = MAX_FIELD) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def _huge(v: object) -> bool:
    return isinstance(v, int) and not -(2**63) <= v < 2**64


def _text(v: object) -> str:
    try:
        return _cut(repr(v))
    except Exception:  # a repr that fails (or recurses without end) still leaves its type
        return f"<unprintable {type(v).__name__}>"


def setup(level: str = "info") -> None:
    # The JSON lines carry none of the caller, thread or process fields, and the logging HOWTO's
    # "Optimization" switches skip collecting them: a log call then costs ~9 µs instead of ~21 µs,
    # which counts on the webhook's hot path (one line per admitted RayJob).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def ref(obj: dict[str, Any]) -> dict[str, str]:
    """The fields that name an object in a log line ("object", since a LogRecord owns "name")."""
    return {"kind": str(obj.get("kind", "")), "namespace": meta_str(obj, "namespace"), "object": meta_str(obj, "name")}
