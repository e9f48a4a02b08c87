"""MIG through the agent's code: the instances it lists, and one created and removed by the
same ``MigInstances`` that Allocate uses (agent.mig), each step confirmed by reading the
card again (and by ``nvidia-smi -L`` where there is one).

A card's instances may be in use, so the check creates one only on a card without any,
unless ``--mig-reconfigure`` lets it replace them (it creates the same profiles again
afterwards; their UUIDs change). MIG mode itself is the administrator's to switch; with
``--enable-mig`` the check switches it on for a card that can run MIG (nvidia-smi, as
root) and off again at the end.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from typing import Any, Final

from gpu_check.context import Run
from gpu_check.outcome import CheckResult, failed, passed, skipped
from gpu_check.smi import parse_listing
from vgpu_operator.agent import mig
from vgpu_operator.agent.deviceplugin.allocation import AllocationError
from vgpu_operator.agent.readings import GpuReading
from vgpu_operator.devices import model

LIST: Final = "MIG: the instances the agent lists"
CREATE: Final = "MIG: create and remove one instance"
_SMI_TIMEOUT_S: Final = 60.0


def _mig_cards(run: Run) -> list[GpuReading]:
    assert run.backend is not None
    return [gpu for gpu in run.backend.read().gpus if gpu.mig_enabled]


def _instances_text(gpu: GpuReading) -> str:
    if not gpu.mig_instances:
        return "none"
    return ", ".join(
        f"{m.profile} (GI {m.gpu_instance_id}, CI {m.compute_instance_id}, {m.uuid})"
        for m in gpu.mig_instances
    )


def list_instances(run: Run) -> CheckResult:
    if run.backend is None:
        return skipped(LIST, "no backend (the inventory reading failed)")
    gpus = run.backend.read().gpus
    capable = [g for g in gpus if g.mig_enabled is not None]
    on = [g for g in gpus if g.mig_enabled]
    details = [
        f"- #{g.index} {g.uuid}: MIG {'on' if g.mig_enabled else 'off'}; "
        f"instances: {_instances_text(g)}"
        for g in capable
    ]
    if not on:
        what = f"{len(capable)} card(s) can run MIG" if capable else "no card can run MIG"
        return skipped(LIST, f"MIG mode is off on every card ({what})", details)
    count = sum(len(g.mig_instances) for g in on)
    return passed(LIST, f"{len(on)} card(s) in MIG mode, {count} instance(s)", details)


def _smi(run: Run, *args: str) -> tuple[int, str]:
    smi = shutil.which(run.options.nvidia_smi)
    if smi is None:
        return -1, "nvidia-smi not found"
    try:
        done = subprocess.run(
            [smi, *args],
            capture_output=True,
            text=True,
            timeout=run.budget.timeout(_SMI_TIMEOUT_S),
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def _smi_lists(run: Run, card_uuid: str) -> set[str] | None:
    """The MIG UUIDs ``nvidia-smi -L`` shows on the card (None: no nvidia-smi to ask)."""
    if run.options.simulated:
        return None
    code, text = _smi(run, "-L")
    if code != 0:
        return None
    try:
        listing = parse_listing(text)
    except ValueError:
        return None
    return {m.uuid for g in listing if g.uuid == card_uuid for m in g.migs}


def create_and_remove(run: Run) -> CheckResult:
    if run.backend is None:
        return skipped(CREATE, "no backend (the inventory reading failed)")
    enabled: GpuReading | None = None
    try:
        cards = _mig_cards(run)
        if not cards and run.options.enable_mig and not run.options.simulated:
            enabled, note = _enable_mig(run)
            if enabled is None:
                return skipped(CREATE, f"MIG mode could not be switched on: {note}")
            cards = _mig_cards(run)
        if not cards:
            hint = "" if run.options.enable_mig else " (--enable-mig switches it on for the check)"
            return skipped(CREATE, f"no card is in MIG mode{hint}")
        return _exercise(run, cards[0])
    finally:
        if enabled is not None:
            code, text = _smi(run, "-i", str(enabled.index), "-mig", "0")
            run.notes.append(
                f"MIG mode switched off again on #{enabled.index}: exit {code}: {text[-200:]}"
            )


def _enable_mig(run: Run) -> tuple[GpuReading | None, str]:
    assert run.backend is not None
    capable = [g for g in run.backend.read().gpus if g.mig_enabled is False and g.healthy]
    if not capable:
        return None, "no card can run MIG"
    card = capable[0]
    code, text = _smi(run, "-i", str(card.index), "-mig", "1")
    if code != 0:
        return None, f"nvidia-smi -i {card.index} -mig 1: exit {code}: {text[-300:]}"
    if not any(g.uuid == card.uuid for g in _mig_cards(run)):
        # The mode is pending until the card is reset: switch the request back.
        _smi(run, "-i", str(card.index), "-mig", "0")
        return (
            None,
            f"nvidia-smi accepted MIG mode on #{card.index} but NVML does not report it "
            f"on: {text[-300:]}",
        )
    run.notes.append(f"MIG mode switched on for the check on #{card.index}: {text[-200:]}")
    return card, text


def _exercise(run: Run, card: GpuReading) -> CheckResult:
    assert run.backend is not None
    before = list(card.mig_instances)
    details = [f"- card #{card.index} {card.uuid}; instances before: {_instances_text(card)}"]
    if before and not run.options.mig_reconfigure:
        return skipped(
            CREATE,
            f"#{card.index} has {len(before)} instance(s) that may be in use; --mig-reconfigure "
            "lets the check replace them (it puts the same profiles back)",
            details,
        )
    geometry: list[model.Geometry] = []
    instances = mig.MigInstances(run.backend.nvml_module, lambda card_type: geometry)
    profiles = instances.offered_profiles(card.uuid)
    if not profiles:
        return failed(
            CREATE, f"#{card.index} is in MIG mode but offers no GPU instance profile", details
        )
    smallest = profiles[0]
    details.append(f"- profiles offered: {', '.join(profiles)}; creating one {smallest}")
    geometry[:] = [(model.MigTemplate(smallest, 0, 0, 1),)]
    problems: list[str] = []
    data: dict[str, Any] = {"profiles": profiles}
    try:
        created = instances.device(card.uuid, 0, 0)
        data["created"] = created
        after = _card(run, card.uuid)
        details.append(f"- created {created}; the agent reads: {_instances_text(after)}")
        if [m.uuid for m in after.mig_instances] != [created] or after.mig_instances[
            0
        ].profile != smallest:
            problems.append(
                f"after creating, the card has {_instances_text(after)}, "
                f"expected one {smallest} {created}"
            )
        listed = _smi_lists(run, card.uuid)
        if listed is not None:
            details.append(f"- nvidia-smi -L lists: {sorted(listed) or 'none'}")
            if listed != {created}:
                problems.append(f"nvidia-smi -L lists {sorted(listed)}, expected {created}")
        removed = instances.remove_all(card.uuid)
        gone = _card(run, card.uuid)
        details.append(f"- removed {removed}; the agent reads: {_instances_text(gone)}")
        if removed != [created] or gone.mig_instances:
            problems.append(f"after removing, the card has {_instances_text(gone)}")
        listed = _smi_lists(run, card.uuid)
        if listed:
            problems.append(f"nvidia-smi -L still lists {sorted(listed)}")
    except AllocationError as exc:
        problems.append(str(exc))
    finally:
        if before:
            problems += _restore(
                run, instances, geometry, card.uuid, [m.profile or "" for m in before], details
            )
    if problems:
        return failed(CREATE, "; ".join(problems), details, **data)
    return passed(
        CREATE,
        f"one {smallest} created and removed on #{card.index}, confirmed by reading the card",
        details,
        **data,
    )


def _card(run: Run, uuid: str) -> GpuReading:
    assert run.backend is not None
    (gpu,) = [g for g in run.backend.read().gpus if g.uuid == uuid]
    return gpu


def _restore(
    run: Run,
    instances: mig.MigInstances,
    geometry: list[model.Geometry],
    uuid: str,
    profiles: list[str],
    details: list[str],
) -> list[str]:
    """The profiles the card had before, created again through the agent's code."""
    geometry[:] = [tuple(model.MigTemplate(p, 0, 0, 1) for p in profiles)]
    try:
        instances.device(uuid, 0, 0)
    except AllocationError as exc:
        return [f"the card's instances could not be put back ({profiles}): {exc}"]
    after = _card(run, uuid)
    details.append(f"- put back: {_instances_text(after)}")
    if Counter(m.profile for m in after.mig_instances) != Counter(profiles):
        return [f"after putting back, the card has {_instances_text(after)}, not {profiles}"]
    return []
