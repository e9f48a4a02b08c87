"""A second operator on a busy metrics port (issue 44): it retried start-up forever with
"Duplicated timeseries". The HTTP server is bound before Kopf starts, so the process
fails at once, with one sentence; and a start-up done twice registers its metrics once."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.handlers import app as operator_app
from vgpu_operator.handlers import runtime
from vgpu_operator.metrics import OperatorMetrics


@pytest.fixture
def busy_port() -> Iterator[int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        yield int(holder.getsockname()[1])
    finally:
        holder.close()


def test_a_busy_metrics_port_stops_the_operator_at_once_with_a_sentence(busy_port: int) -> None:
    options = OperatorOptions(standalone=True, metrics_port=busy_port, metrics_addr="127.0.0.1")
    operator = runtime.OperatorThread(options)
    with pytest.raises(RuntimeError, match="failed to start") as failed:
        operator.start(timeout_s=30)
    cause = failed.value.__cause__
    assert isinstance(cause, operator_app.ServingError)
    assert f"127.0.0.1:{busy_port}" in str(cause)
    assert "give --metrics-port another" in str(cause)
    assert not operator.alive


def test_the_command_line_exits_with_the_sentence(busy_port: int) -> None:
    options = OperatorOptions(standalone=True, metrics_port=busy_port, metrics_addr="127.0.0.1")
    with pytest.raises(SystemExit, match="holds the port"):
        runtime.run_forever(options)


def test_defragmentation_counters_register_once_per_metrics() -> None:
    metrics = OperatorMetrics()
    assert metrics.defrag() is metrics.defrag()  # a second assembly: no duplicated series
