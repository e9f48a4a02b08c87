"""Prepare, as a pure function: a claim's allocation and this node's cards in, the CDI spec
that gives the container HAMi-core's settings for its share out.

kubelet's NodePrepareResources names a claim; the driver reads it from the API server and
hands it here with the cards this node publishes. Each device of this driver allocated to
the claim becomes one CDI device; the claim's spec (one file per claim, so Unprepare
removes exactly it) carries what HAMi-core reads:

- ``NVIDIA_VISIBLE_DEVICES``: the cards' UUIDs (the NVIDIA runtime hands those over);
- ``CUDA_DEVICE_MEMORY_LIMIT_<i>``: the memory the claim consumes of card ``i``, per device;
- ``CUDA_DEVICE_SM_LIMIT``: the cores it consumes (of the first card, as HAMi does);
- ``CUDA_DEVICE_MEMORY_SHARED_CACHE`` and the claim's own cache directory, HAMi-core's
  lock directory, ``libvgpu.so`` and, unless HAMi-core is off for the claim,
  ``/etc/ld.so.preload`` (the file that makes every process load the library).

Nothing here guesses: a claim that is not this node's, names a card this node does not
publish, or consumes more than a card has raises ``PrepareError`` saying which and why.
``check_room`` also refuses a claim that, with the claims already prepared on this node,
would take more of a card than it has: the allocator is trusted to count, not believed.
Each CDI device records what it holds (an annotation), so the holdings are read back from
the spec files after an agent restart.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.agent.deviceplugin.allocation import (
    CONTAINER_HOOK_DIR,
    LOCK_DIR,
    PRELOAD_FILE,
    NodeSettings,
)
from vgpu_operator.devices import dra, nvidia

#: The CDI kind of this driver's devices (vendor/class).
CDI_VENDOR: Final = "vgpu-operator.io"
CDI_CLASS: Final = "gpu"
CDI_KIND: Final = f"{CDI_VENDOR}/{CDI_CLASS}"
#: The CDI spec version written: environment and mounts need nothing newer.
CDI_VERSION: Final = "0.6.0"

#: An opaque device configuration of this driver (in the claim or its class) may turn
#: HAMi-core off for the claim: ``{"hamiCore": false}`` (no preload; the limits are
#: still set for a process that loads the library itself).
CONFIG_HAMI_CORE: Final = "hamiCore"

#: The CDI device annotation recording what the device holds of its card.
HOLDS_ANNOTATION: Final = f"{CDI_VENDOR}/holds"

_CDI_NAME_UNSAFE: Final = re.compile(r"[^a-zA-Z0-9_.:-]")


class PrepareError(Exception):
    """Prepare cannot honour the claim; the message is for kubelet and the pod's events."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device, as kubelet's NodePrepareResources answer names it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None
    cdi_ids: tuple[str, ...]


def prepared_device(share: dra.Share, cdi_name: str) -> PreparedDevice:
    """What kubelet is told of one allocated share, handed over as the CDI device
    ``cdi_name``: the request it serves (a subrequest answers for its request)."""
    return PreparedDevice(
        requests=(share.request.split("/", 1)[0],),
        pool=share.pool,
        device=share.device,
        share_id=share.share_id,
        cdi_ids=(f"{CDI_KIND}={cdi_name}",),
    )


@dataclass(frozen=True, slots=True)
class CardHold:
    """What one prepared device of a claim takes of one card."""

    device: str
    memory_mib: int
    cores: int
    shares: int

    def annotation(self) -> str:
        return json.dumps(
            {
                "device": self.device,
                "memoryMiB": self.memory_mib,
                "cores": self.cores,
                "shares": self.shares,
            },
            sort_keys=True,
        )


@dataclass(frozen=True, slots=True)
class Prepared:
    """A claim made ready on this node: the CDI spec to write and what kubelet is told."""

    claim_uid: str
    spec: Mapping[str, Any]
    devices: tuple[PreparedDevice, ...]
    #: The host directory to create for the claim's HAMi-core cache ("" for none).
    cache_dir: str
    holds: tuple[CardHold, ...] = ()


#: Every spec file of this driver starts so.
SPEC_FILE_PREFIX: Final = f"{CDI_VENDOR}-{CDI_CLASS}_"


def spec_file_name(claim_uid: str) -> str:
    """The claim's CDI spec file (one per claim; the name is all Unprepare needs)."""
    return f"{SPEC_FILE_PREFIX}{_CDI_NAME_UNSAFE.sub('-', claim_uid)}.json"


def claim_cache_dir(settings: NodeSettings, claim_uid: str) -> str:
    return f"{settings.host.hook_dir}/claims/{_CDI_NAME_UNSAFE.sub('-', claim_uid)}"


def _hami_core_on(claim: Mapping[str, Any]) -> bool:
    """False when an opaque config of this driver, from the claim or its class, says
    ``hamiCore: false``; the claim's own config wins over its class's (the later one)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    configs = (allocation.get("devices") or {}).get("config") or []
    on = True
    ordered = sorted(configs, key=lambda c: 0 if c.get("source") == "FromClass" else 1)
    for config in ordered:
        opaque = config.get("opaque") or {}
        if opaque.get("driver") != dra.DRIVER:
            continue
        parameters = opaque.get("parameters") or {}
        if isinstance(parameters, Mapping) and CONFIG_HAMI_CORE in parameters:
            on = parameters[CONFIG_HAMI_CORE] is not False
    return on


def prepare(
    claim: Mapping[str, Any],
    node: str,
    cards: Mapping[str, dra.CardShape],
    settings: NodeSettings,
) -> Prepared:
    """The CDI spec and kubelet's answer for ``claim`` on ``node``, whose published cards
    are ``cards`` (device name -> shape). Raises PrepareError."""
    try:
        allocation = dra.read_allocation(claim, dra.DRIVER, node)
    except dra.AllocationUnreadable as exc:
        raise PrepareError(str(exc)) from None
    where = f"claim {allocation.namespace}/{allocation.name}"
    if not allocation.uid:
        raise PrepareError(f"{where} has no uid")
    visible: list[str] = []
    devices: list[dict[str, Any]] = []
    prepared: list[PreparedDevice] = []
    cores: list[int] = []
    holds: list[CardHold] = []
    for position, share in enumerate(allocation.shares):
        card = cards.get(share.device)
        if card is None:
            raise PrepareError(
                f"{where}: device {share.device!r} is not a card this node publishes "
                f"(it has {', '.join(sorted(cards)) or 'none'}); was the slice stale?"
            )
        memory_mib, core_share = _checked_amounts(where, share, card)
        _check_exclusive(where, allocation.classes, share, card, memory_mib, core_share)
        visible.append(card.uuid)
        cores.append(core_share)
        taken = 1 if share.shares is None else int(-(-share.shares // 1))
        holds.append(CardHold(share.device, memory_mib, core_share, taken))
        cdi_name = _CDI_NAME_UNSAFE.sub("-", f"{allocation.uid}-{position}")
        devices.append(
            {
                "name": cdi_name,
                "annotations": {HOLDS_ANNOTATION: holds[-1].annotation()},
                "containerEdits": {
                    "env": [f"CUDA_DEVICE_MEMORY_LIMIT_{position}={memory_mib}m"],
                },
            }
        )
        prepared.append(prepared_device(share, cdi_name))
    cache_dir = claim_cache_dir(settings, allocation.uid)
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "containerEdits": _claim_edits(
            allocation.uid, visible, cores[0], cache_dir, settings, _hami_core_on(claim)
        ),
        "devices": devices,
    }
    return Prepared(allocation.uid, spec, tuple(prepared), cache_dir, tuple(holds))


def _per_card(holds: Iterable[CardHold]) -> dict[str, list[int]]:
    """Per card (its device name), the memory, cores and shares ``holds`` take of it."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for hold in holds:
        total = totals[hold.device]
        total[0] += hold.memory_mib
        total[1] += hold.cores
        total[2] += hold.shares
    return totals


def check_room(
    where: str,
    wanted: Iterable[CardHold],
    held: Iterable[CardHold],
    cards: Mapping[str, dra.CardShape],
) -> None:
    """Refuse ``wanted`` when, with what the node's other prepared claims ``held``, it
    would take more memory, cores or shares of a card than the card has."""
    totals, mine = _per_card(held), _per_card(wanted)
    for device, (memory, cores, shares) in mine.items():
        card = cards.get(device)
        if card is None:
            continue  # prepare() refused it already
        other = totals.get(device, [0, 0, 0])
        for what, used, asked, limit in (
            ("MiB of memory", other[0], memory, card.memory_mib),
            ("cores", other[1], cores, card.cores),
            ("shares", other[2], shares, card.split_count),
        ):
            if used + asked > limit:
                raise PrepareError(
                    f"{where}: card {card.uuid} has {limit} {what} and the claims prepared "
                    f"on this node hold {used}; this one asks {asked} more: its allocation "
                    "over-commits the card (was it written by something other than the "
                    "scheduler?)"
                )


def holds_of(spec: Mapping[str, Any]) -> tuple[CardHold, ...]:
    """What a CDI spec this driver wrote records as held (unreadable records: none)."""
    holds = []
    for device in spec.get("devices") or []:
        raw = (device.get("annotations") or {}).get(HOLDS_ANNOTATION)
        try:
            record = json.loads(raw) if isinstance(raw, str) else {}
            holds.append(
                CardHold(
                    str(record["device"]),
                    int(record["memoryMiB"]),
                    int(record["cores"]),
                    int(record["shares"]),
                )
            )
        except (TypeError, KeyError, ValueError):
            continue
    return tuple(holds)


def _checked_amounts(where: str, share: dra.Share, card: dra.CardShape) -> tuple[int, int]:
    """The memory (MiB) and cores the share consumes, refused when more than the card has.
    A result without consumed capacity is the whole card (allocated without sharing)."""
    memory = card.memory_mib if share.memory_mib is None else share.memory_mib
    if share.cores is None:
        cores = card.cores
    elif share.cores.denominator != 1:
        raise PrepareError(f"{where}: consumed cores {share.cores} is not a whole percent")
    else:
        cores = int(share.cores)
    if memory < 1 or memory > card.memory_mib:
        raise PrepareError(
            f"{where}: consumes {memory} MiB of card {card.uuid}, which has "
            f"{card.memory_mib} MiB on this node; the slice the allocator read was not this "
            "node's"
        )
    if cores > card.cores:
        raise PrepareError(
            f"{where}: consumes {cores} cores of card {card.uuid}, which has {card.cores}"
        )
    if share.shares is not None and share.shares > card.split_count:
        raise PrepareError(
            f"{where}: consumes {share.shares} shares of card {card.uuid}, which has "
            f"{card.split_count}"
        )
    return memory, cores


def _check_exclusive(
    where: str,
    classes: Mapping[str, str],
    share: dra.Share,
    card: dra.CardShape,
    memory_mib: int,
    cores: int,
) -> None:
    """A request of the exclusive class must hold the whole card; the allocator gives it
    the whole card's memory only while the request policy's default is the whole card
    (``defaultMemory`` 0) and the claim names no memory."""
    if classes.get(share.request) != dra.EXCLUSIVE_CLASS:
        return
    if memory_mib < card.memory_mib:
        raise PrepareError(
            f"{where}: request {share.request!r} is of class {dra.EXCLUSIVE_CLASS} but holds "
            f"{memory_mib} of {card.memory_mib} MiB of card {card.uuid}; an exclusive request "
            "names no memory (and needs the device config's defaultMemory to be 0)"
        )


def _claim_edits(
    claim_uid: str,
    visible: Sequence[str],
    cores: int,
    cache_dir: str,
    settings: NodeSettings,
    hami_core: bool,
) -> dict[str, Any]:
    cache_name = _CDI_NAME_UNSAFE.sub("-", claim_uid)
    env = [
        f"{nvidia.VISIBLE_DEVICES_ENV}={','.join(visible)}",
        f"CUDA_DEVICE_SM_LIMIT={cores}",
        f"CUDA_DEVICE_MEMORY_SHARED_CACHE={CONTAINER_HOOK_DIR}/{cache_name}.cache",
    ]
    if settings.device_memory_scaling > 1:
        env.append("CUDA_OVERSUBSCRIBE=true")
    if settings.core_policy == "disable":
        env.append("GPU_CORE_UTILIZATION_POLICY=disable")
    host = settings.host
    # The directory first: the library is mounted into it.
    mounts = [
        _mount(cache_dir, CONTAINER_HOOK_DIR, read_only=False),
        _mount(f"{host.hook_dir}/{host.library}", f"{CONTAINER_HOOK_DIR}/libvgpu.so", True),
        _mount(host.lock_dir, LOCK_DIR, read_only=False),
    ]
    if hami_core:
        mounts.append(_mount(f"{host.hook_dir}/ld.so.preload", PRELOAD_FILE, read_only=True))
    return {"env": env, "mounts": mounts}


def _mount(host_path: str, container_path: str, read_only: bool) -> dict[str, Any]:
    options = ["ro" if read_only else "rw", "nosuid", "nodev", "bind"]
    return {"hostPath": host_path, "containerPath": container_path, "options": options}
