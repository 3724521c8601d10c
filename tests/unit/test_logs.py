"""Log lines are JSON, one per record, with the fields a caller passes and never a caller frame."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import orjson
import pytest

from raygate import logs


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
    assert "raygate.logs" in str(line["path"])
