"""Fixtures shared by unit tests of more than one module."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the root logger's handlers and level, and structlog's configuration, back as
    they were: tests that call ``vgpu_logging.configure`` change process-wide state."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
