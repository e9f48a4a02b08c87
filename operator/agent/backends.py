"""Where the agent's readings come from: real NVML or a simulated machine file."""

from __future__ import annotations

from typing import Any, Protocol

from vgpu_operator.agent.nvml import NvmlReader
from vgpu_operator.agent.readings import MachineReading
from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.errors import ConfigError

SIM_PREFIX = "sim:"


class Backend(Protocol):
    """A source of machine readings. ``read`` and ``watch_health`` block (they run in
    worker threads) and may run at the same time."""

    @property
    def description(self) -> str:
        """``nvml`` or ``sim:<file>``, as reported in the inventory."""
        ...

    def open(self) -> None: ...

    def read(self) -> MachineReading: ...

    def watch_health(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a health event; True when a card's health changed."""
        ...

    def close(self) -> None: ...

    def nvml_module(self) -> Any:
        """The pynvml-shaped module it reads through (MIG instances are made with it)."""
        ...


def backend_from_spec(spec: str, node_name: str) -> Backend:
    """``nvml`` -> the real GPUs; ``sim:FILE`` or ``sim:NAME`` (a bundled machine)."""
    if spec == "nvml":
        return NvmlReader()
    if spec.startswith(SIM_PREFIX) and len(spec) > len(SIM_PREFIX):
        return SimulatedBackend(resolve_machine_path(spec[len(SIM_PREFIX) :]), node_name)
    raise ConfigError("backend", f"expected 'nvml' or 'sim:FILE', got {spec!r}")
