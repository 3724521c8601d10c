"""Log lines are JSON, one per record, with the fields a caller passes and never a caller frame."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import orjson
import pytest

from raygate.core import logs


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    saved = (logging.getLogger().handlers[:], logging.getLogger().level, logging._srcfile, logging.logThreads,
             logging.logProcesses, logging.logMultiprocessing)
    logs.setup("info")
    yield stream
    root = logging.getLogger()
    root.handlers[:], level, logging._srcfile, logging.logThreads, logging.logProcesses, \
        logging.logMultiprocessing = saved
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_is_one_json_line_with_its_fields(captured: io.StringIO) -> None:
    logging.getLogger("raygate.webhook").info(
        "admission", extra={"namespace": "team-a", "object": "train", "outcome": "mutated", "allowed": True})
    logging.getLogger("raygate.webhook").debug("not at info level")
    [line] = lines(captured)
    assert line["msg"] == "admission" and line["level"] == "info" and line["logger"] == "raygate.webhook"
    assert (line["namespace"], line["object"], line["outcome"], line["allowed"]) == ("team-a", "train", "mutated", True)
    assert str(line["ts"]).endswith("Z")
    assert not {"pathname", "lineno", "funcName", "thread", "process", "processName"} & set(line)


def test_an_exception_is_carried_in_the_same_line(captured: io.StringIO) -> None:
    try:
        raise ValueError("bad quantity '2 GPUs'")
    except ValueError:
        logging.getLogger("raygate.reconciler").exception("reconcile failed", extra={"namespace": "n", "object": "j"})
    [line] = lines(captured)
    assert line["level"] == "error" and "ValueError: bad quantity '2 GPUs'" in str(line["error"])


def test_values_json_cannot_hold_are_written_as_text(captured: io.StringIO) -> None:
    logging.getLogger("raygate").warning("odd", extra={"path": logs})
    [line] = lines(captured)
    assert "raygate.core.logs" in str(line["path"])


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _deep(levels: int) -> list[object]:
    top: list[object] = []
    cur = top
    for _ in range(levels):
        nxt: list[object] = []
        cur.append(nxt)
        cur = nxt
    return top


def test_no_line_is_lost_on_deep_or_odd_values(captured: io.StringIO) -> None:
    cycle: dict[str, object] = {}
    cycle["self"] = cycle
    log = logging.getLogger("raygate.webhook")
    log.warning("odd", extra={"deep": _deep(5000), "cycle": cycle, "big": 10**40, "bad": _Unprintable(),
                              "keys": {(1, 2): "tuple key"}, "kept": "plain"})
    [first] = lines(captured)
    assert first["msg"] == "odd" and first["kept"] == "plain" and first["bad"] == "<unprintable _Unprintable>"
    assert "10000000000" in str(first["big"]) and "self" in str(first["cycle"])
    bad_format = logging.makeLogRecord({"msg": "a %d that does not format", "args": ("text",), "levelname": "INFO"})
    assert "unformattable" in str(orjson.loads(logs.JsonFormatter().format(bad_format))["msg"])


def test_huge_values_are_cut_to_a_bounded_line(captured: io.StringIO) -> None:
    logging.getLogger("raygate.webhook").info("x" * 100_000, extra={"reason": "y" * 100_000})
    [line] = lines(captured)
    assert len(str(line["msg"])) < logs.MAX_FIELD + 100 and "more characters" in str(line["reason"])
