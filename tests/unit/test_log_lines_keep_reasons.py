"""A refusal's log line keeps its reason: a line is bounded (one value, then the whole
line), but the reason fields are cut last and every cut is made in the middle, so a
refusal that quotes a huge value before saying why still says why. Before, each value
was cut at its end (the reason after a 200 kB annotation was lost), and an API error
kept only the first 300 characters of its Status JSON (``kind``, ``apiVersion``...)."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from vgpu_operator import logging as vgpu_logging
from vgpu_operator.kube.requests import ApiError

pytestmark = pytest.mark.usefixtures("restore_logging")


def _line(**fields: object) -> tuple[str, dict[str, object]]:
    stream = io.StringIO()
    vgpu_logging.configure("json", "INFO", stream=stream)
    structlog.get_logger("vgpu_operator.operator").info("pod_denied", **fields)
    (line,) = [entry for entry in stream.getvalue().splitlines() if entry.strip()]
    return line, json.loads(line)


def test_the_reason_after_a_huge_quoted_value_is_kept() -> None:
    reason = "annotation hami.io/device-scoring-weights='" + "slot=1," * 30_000 + "'"
    reason += ": expected three entries slot=N,core=N,memory=N"
    line, entry = _line(pod="ns/p", reason=reason)
    assert str(entry["reason"]).endswith(": expected three entries slot=N,core=N,memory=N")
    assert str(entry["reason"]).startswith("annotation hami.io/device-scoring-weights=")
    assert "more characters" in str(entry["reason"])
    assert len(line) < vgpu_logging.MAX_VALUE_CHARS + 500


def test_other_fields_are_cut_before_the_reason() -> None:
    reason = "r" * 1500 + " because the card is cordoned"
    others = {f"field{i}": str(i) * 1900 for i in range(6)}
    line, entry = _line(reason=reason, **others)
    assert entry["reason"] == reason  # whole
    assert len(line) < vgpu_logging.MAX_LINE_CHARS + 1000
    assert sum("more characters" in str(entry[k]) for k in others) >= 4


def test_a_huge_list_is_bounded_as_its_text() -> None:
    line, entry = _line(reason="no room", refused=[f"ns/pod-{i}" for i in range(5000)])
    assert entry["reason"] == "no room"
    assert len(line) < vgpu_logging.MAX_VALUE_CHARS + 500
    assert str(entry["refused"]).endswith("'ns/pod-4999']")


def test_an_api_error_says_the_status_reason_and_message() -> None:
    message = 'Pod "p" is invalid: ' + "metadata.annotations: Too long, " * 40 + "final cause"
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "12345"},
            "status": "Failure",
            "message": message,
            "reason": "Invalid",
            "details": {"name": "p", "kind": "pods", "causes": [{"field": "x"}] * 50},
            "code": 422,
        }
    )
    error = ApiError("PATCH", "/api/v1/namespaces/ns/pods/p", 422, body)
    text = str(error)
    assert text.startswith("PATCH /api/v1/namespaces/ns/pods/p: HTTP 422: Invalid: Pod")
    assert text.endswith("final cause")
    assert len(text) < 800
    assert error.reason == "Invalid"


def test_an_api_error_without_a_status_is_cut_in_the_middle() -> None:
    body = "<html>" + "x" * 5000 + "gateway timeout</html>"
    text = str(ApiError("GET", "/api/v1/pods", 504, body))
    assert text.endswith("gateway timeout</html>")
    assert "more characters" in text
