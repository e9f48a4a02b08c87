"""One log format per process: our structlog events and stdlib records (Kopf's) alike."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from vgpu_operator import logging as vgpu_logging


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


pytestmark = pytest.mark.usefixtures("restore_logging")


def _lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line.strip()]


def test_json_lines_for_our_events_and_for_kopf_records() -> None:
    stream = io.StringIO()
    assert vgpu_logging.configure("json", "INFO", stream=stream) == "json"
    structlog.get_logger("vgpu_operator.agent").info("inventory_reported", node="n1", gpus=8)
    logging.getLogger("kopf.objects").warning("Handler %s failed", "on_pod")
    ours, kopfs = (json.loads(line) for line in _lines(stream))
    assert ours["event"] == "inventory_reported"
    assert (ours["node"], ours["gpus"], ours["level"]) == ("n1", 8, "info")
    assert ours["logger"] == "vgpu_operator.agent"
    assert kopfs["event"] == "Handler on_pod failed"
    assert (kopfs["level"], kopfs["logger"]) == ("warning", "kopf.objects")
    assert "timestamp" in ours
    assert "timestamp" in kopfs


def test_level_filters_both_sources() -> None:
    stream = io.StringIO()
    vgpu_logging.configure("json", "WARNING", stream=stream)
    structlog.get_logger("x").info("hidden")
    logging.getLogger("kopf").info("hidden too")
    structlog.get_logger("x").error("shown")
    assert [json.loads(line)["event"] for line in _lines(stream)] == ["shown"]


def test_debug_events_appear_only_at_debug() -> None:
    quiet, loud = io.StringIO(), io.StringIO()
    vgpu_logging.configure("json", "INFO", stream=quiet)
    structlog.get_logger("x").debug("pods_woken", woken=3)
    vgpu_logging.configure("json", "DEBUG", stream=loud)
    structlog.get_logger("x").debug("pods_woken", woken=3)
    assert _lines(quiet) == []
    assert [json.loads(line)["woken"] for line in _lines(loud)] == [3]


@pytest.mark.parametrize(
    ("stream", "chosen"),
    [
        pytest.param(io.StringIO(), "json", id="pipe-gets-json"),
        pytest.param(_Tty(), "console", id="tty-gets-console"),
    ],
)
def test_auto_format_depends_on_the_terminal(stream: io.StringIO, chosen: str) -> None:
    assert vgpu_logging.configure("auto", stream=stream) == chosen


def test_console_format_is_not_json() -> None:
    stream = io.StringIO()
    vgpu_logging.configure("console", stream=stream)
    structlog.get_logger("x").info("pod_bound", pod="ns/p")
    (line,) = _lines(stream)
    assert "pod_bound" in line
    assert "pod=ns/p" in line
    assert not line.startswith("{")


def test_configuring_twice_does_not_duplicate_lines() -> None:
    stream = io.StringIO()
    vgpu_logging.configure("json", stream=stream)
    vgpu_logging.configure("json", stream=stream)
    logging.getLogger("kopf").warning("once")
    assert len(_lines(stream)) == 1


def test_unknown_level_is_an_error() -> None:
    with pytest.raises(ValueError, match="LOUD"):
        vgpu_logging.configure("json", "LOUD", stream=io.StringIO())


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_huge_value_is_cut_in_our_events_and_in_library_records(fmt: str) -> None:
    """A refusal quoting a 200 kB annotation writes a line of bounded length."""
    stream = io.StringIO()
    vgpu_logging.configure(fmt, "INFO", stream=stream)  # type: ignore[arg-type]
    huge = "x" * 200_000
    structlog.get_logger("vgpu_operator.operator").info("pod_denied", reason=huge)
    logging.getLogger("kopf.objects").warning("refused: %s", huge)
    lines = _lines(stream)
    assert len(lines) == 2
    for line in lines:
        assert len(line) < vgpu_logging.MAX_VALUE_CHARS + 500
        assert "more characters" in line
