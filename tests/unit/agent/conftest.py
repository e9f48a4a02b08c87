"""Fixtures of the agent's unit tests (the fakes themselves live in agent_fakes.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.agent.simulated import SimulatedBackend

# Tests are imported with --import-mode=importlib, which puts nothing on sys.path; the
# fakes next to this file are made importable the way tests/conftest.py does for builders.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

from agent_fakes import FakeClock  # noqa: E402


@pytest.fixture
def write_machine(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write a machine dict as YAML; returns its path (same path on every call)."""
    path = tmp_path / "machine.yaml"

    def write(body: dict[str, Any]) -> Path:
        path.write_text(yaml.safe_dump(body))
        return path

    return write


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend() -> SimulatedBackend:
    """The simulated A100 with MIG (``a100-mig``) as node-a's backend, opened; a test
    module may name another ``backend`` of its own."""
    opened = SimulatedBackend(resolve_machine_path("a100-mig"), "node-a")
    opened.open()
    return opened
