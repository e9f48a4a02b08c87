"""The agent's reading of the machine: the DeviceInventory it would write, and each field
against nvidia-smi."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from typing import Any, Final

import yaml

from gpu_check.compare import FieldCheck, compare_inventory, mismatches
from gpu_check.context import Run
from gpu_check.outcome import CheckResult, failed, passed, skipped
from gpu_check.smi import SmiSnapshot, take_snapshot
from vgpu_operator import names, resources
from vgpu_operator.agent import backends, health
from vgpu_operator.agent.inventory import RegistrationOptions, build_status

READ: Final = "inventory: the agent reads the machine"
COMPARE: Final = "inventory: fields against nvidia-smi"
_SMI_TIMEOUT_S: Final = 60.0


def inventory_object(status: resources.DeviceInventoryStatus, node: str) -> dict[str, Any]:
    """The whole object as the agent's writes leave it on the API server."""
    return {
        "apiVersion": resources.API_VERSION,
        "kind": names.DEVICE_INVENTORY_KIND,
        "metadata": {"name": node},
        "status": resources.status_to_wire(status),
    }


def read_inventory(run: Run) -> CheckResult:
    """Open the agent's backend (NVML or the simulation), read once, and build the status
    exactly as the agent does (default registration: split 10, no scaling)."""
    node = run.options.node_name
    backend = backends.backend_from_spec(run.options.backend, node)
    backend.open()
    run.backend = backend
    reading = backend.read()
    present = sum(1 for gpu in reading.gpus if gpu.present)
    status = build_status(
        reading,
        node_name=node,
        backend=backend.description,
        options=RegistrationOptions(),
        count=health.check_gpu_count(0, present),
        heartbeat=datetime.now(UTC),
    )
    run.status = status
    document = yaml.safe_dump(inventory_object(status, node), sort_keys=False)
    details = [
        "The DeviceInventory the agent would write:",
        "",
        "```yaml",
        document.rstrip(),
        "```",
    ]
    if not status.devices:
        return failed(READ, f"{backend.description} reports no GPU", details)
    sick = [d for d in status.devices if d.health is not resources.DeviceHealth.HEALTHY]
    models = ", ".join(sorted({d.model for d in status.devices}))
    summary = (
        f"{len(status.devices)} card(s) ({models}), driver {status.driver_version}, "
        f"CUDA {status.cuda_version}"
    )
    if sick:
        reasons = "; ".join(f"{d.uuid}: {d.health_reason}" for d in sick)
        return failed(READ, f"{summary}; unhealthy: {reasons}", details)
    return passed(READ, summary, details, inventory=inventory_object(status, node))


def compare_with_nvidia_smi(run: Run) -> CheckResult:
    if run.status is None:
        return skipped(COMPARE, "no inventory to compare (its reading failed)")
    smi = shutil.which(run.options.nvidia_smi)
    if smi is None:
        where = "the simulated machine has none" if run.options.simulated else "not on PATH"
        return skipped(COMPARE, f"nvidia-smi not found ({run.options.nvidia_smi}: {where})")
    snapshot = take_snapshot(smi, run.budget.timeout(_SMI_TIMEOUT_S))
    return judge(run.status, snapshot)


def judge(status: resources.DeviceInventoryStatus, snapshot: SmiSnapshot) -> CheckResult:
    """The comparison's verdict: any mismatch fails, with both values."""
    problems = [f"- nvidia-smi: {p}" for p in snapshot.problems]
    if snapshot.log is None:
        return failed(COMPARE, "nvidia-smi -q -x gave nothing to compare with", problems)
    checks = compare_inventory(status, snapshot)
    bad = mismatches(checks)
    unchecked = [c for c in checks if c.ok is None]
    details = [*field_table(checks), *(["", *problems] if problems else [])]
    data = {"fields": [_field_data(c) for c in checks]}
    if bad:
        first = "; ".join(
            f"{c.subject} {c.field}: agent {c.agent}, nvidia-smi {c.smi}" for c in bad[:3]
        )
        return failed(COMPARE, f"{len(bad)} mismatch(es): {first}", details, **data)
    summary = f"{len(checks) - len(unchecked)} fields agree"
    if unchecked:
        summary += f"; {len(unchecked)} not checked ({unchecked[0].note})"
    return passed(COMPARE, summary, details, **data)


def field_table(checks: list[FieldCheck]) -> list[str]:
    lines = ["| subject | field | agent | nvidia-smi | result |", "|---|---|---|---|---|"]
    for check in checks:
        verdict = {True: "agree", False: "**MISMATCH**", None: "not checked"}[check.ok]
        if check.note:
            verdict += f" ({check.note})"
        cells = [check.subject, check.field, check.agent, check.smi, verdict]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def _field_data(check: FieldCheck) -> dict[str, Any]:
    return {
        "subject": check.subject,
        "field": check.field,
        "agent": check.agent,
        "nvidiaSmi": check.smi,
        "ok": check.ok,
        "note": check.note,
    }
