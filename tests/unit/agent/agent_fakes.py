"""Fakes for the agent's unit tests: a pynvml-shaped module, small machines, a clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

from vgpu_operator.agent import nvml, sim_machine, simulated


def real_pynvml() -> ModuleType:
    """The installed binding, through the one module allowed to import it."""
    module: ModuleType = nvml.load_pynvml()
    return module


def fake_pynvml(
    machine: dict[str, Any] | sim_machine.SimMachine, node: str = "node-a"
) -> ModuleType:
    """A module shaped like the real ``pynvml``: the binding's own constants and error
    classes, with every function answered from ``machine`` (no driver needed).

    Functions listed in the machine's ``absent`` are missing, as in an old binding.
    """
    real = real_pynvml()
    parsed = (
        machine
        if isinstance(machine, sim_machine.SimMachine)
        else sim_machine.SimMachine.model_validate(machine)
    )
    sim = simulated.SimulatedNvml(parsed, node, error=real.NVMLError)
    fake = ModuleType("pynvml")
    for name in dir(real):
        value = getattr(real, name)
        if name.isupper() or name.startswith("nvmlEventType"):
            setattr(fake, name, value)
    fake.NVMLError = real.NVMLError
    vars(fake).update(
        {k: v for k, v in vars(sim.module()).items() if k.startswith("nvml") and callable(v)}
    )
    fake.simulation = sim  # type: ignore[attr-defined]
    return fake


def nvml_error(code_name: str) -> Exception:
    """The real binding's exception for ``NVML_ERROR_<code_name>``."""
    real = real_pynvml()
    error: Exception = real.NVMLError(getattr(real, f"NVML_ERROR_{code_name}"))
    return error


def machine_dict(gpus: int = 2, **extra: Any) -> dict[str, Any]:
    """A small machine file as a dict: ``gpus`` identical cards on one socket."""
    body: dict[str, Any] = {
        "name": "test-box",
        "defaults": {"name": "NVIDIA A10", "memoryMiB": 23028, "numaNode": 0},
        "gpus": [
            {"uuid": f"GPU-test-{i}", "pciBusId": f"00000000:{0x10 + i:02X}:00.0"}
            for i in range(gpus)
        ],
    }
    body.update(extra)
    return body


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2025, 7, 30, 10, 15, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
