"""MIG placement over time, seed form: geometry templates and ``[geometry-slot]`` suffixes.

A MIG card runs one *geometry* at a time: an ordered list of templates (``1g.5gb`` x 7, ...)
that together partition the card. The first task on an idle card chooses the geometry; the
geometry then stays until every instance is free again (seed 000 §2, hami-semantics §12.1).

This module decides which instance a container gets and keeps ``DeviceUsage.mig`` up to
date. It does not book memory, cores or time slices on the card: the Fit engine does that,
with the instance's memory and cores (returned by ``allocate``) in place of the request's.
It does not parse configuration either: the geometry tables arrive as ``GeometryEntry``
values.

Deliberate differences from HAMi v2.9, each fixing a weakness listed in §14 item 8:

- ``custom_filter`` counts only the earlier picks of this container on *this* card (v2.9
  counted picks on any card, so a container spread over two MIG cards was refused).
- The suffix of a first allocation names the instance's slot in the flattened geometry
  (v2.9 wrote the template's position, wrong when an earlier template has count > 1).
- Templates with ``count <= 0`` are never chosen (they have no instance to take).
- ``restore`` fails closed on entries that cannot be placed (unknown geometry, slot out of
  range, card not in MIG mode): the card is marked unhealthy instead of indexing blindly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from vgpu_operator import errors
from vgpu_operator.devices import codec, model


class MigAllocationError(errors.VgpuError, ValueError):
    """No MIG instance of the card can take the request (the filter should have said so)."""


class GeometryEntry(Protocol):
    """One ``knownMigGeometries`` entry: card models (substrings) and their geometries."""

    @property
    def models(self) -> Sequence[str]: ...

    @property
    def geometries(self) -> Sequence[model.Geometry]: ...


@dataclass(frozen=True, slots=True)
class KnownGeometries:
    """A ready-made ``GeometryEntry`` (the config layer may pass its own type instead)."""

    models: tuple[str, ...]
    geometries: tuple[model.Geometry, ...]


def instance_uuid(card_id: str, geometry: int, slot: int) -> str:
    """The seed-form id of one MIG instance: ``f"{card_id}[{geometry}-{slot}]"``."""
    return codec.join_mig_uuid(card_id, geometry, slot, field="uuid")


def split_instance_uuid(uuid: str) -> tuple[str, tuple[int, int] | None]:
    """Split ``GPU-a[0-2]`` into ``("GPU-a", (0, 2))``; a plain id gives ``(id, None)``.

    Raises ``errors.CodecError`` when the id contains a bracket but not a valid suffix
    (HAMi's ``ExtractMigTemplatesFromUUID`` error case).
    """
    return codec.split_mig_uuid(uuid, field="uuid")


def geometries_for(card_type: str, known: Iterable[GeometryEntry]) -> tuple[model.Geometry, ...]:
    """The geometries of the first entry one of whose models is a substring of ``card_type``.

    Matching is case-sensitive, as HAMi's ``strings.Contains``; later entries are not
    consulted even if they match too. No match gives ``()``: the card takes no MIG task.
    """
    for entry in known:
        if any(m in card_type for m in entry.models):
            return tuple(entry.geometries)
    return ()


def attach(device: model.DeviceUsage, known: Iterable[GeometryEntry]) -> None:
    """Give a ``mig``-mode card its geometry table, with no geometry active yet.

    Cards in other modes are left untouched (their ``mig`` stays ``None``).
    """
    if device.mode == model.MODE_MIG:
        device.mig = model.MigState(geometries=geometries_for(device.type, known))


def flatten(geometry: model.Geometry) -> list[model.MigTemplate]:
    """The instances of a geometry: each template repeated ``count`` times, in order.

    HAMi's ``PlatternMIG``; slot ``s`` of a ``[g-s]`` suffix indexes this list.
    """
    return [template for template in geometry for _ in range(max(template.count, 0))]


def needs_reset(state: model.MigState) -> bool:
    """True when no instance is in use, so the next allocation may choose a geometry again."""
    return not any(state.in_use)


def reset(state: model.MigState) -> None:
    """Release the active geometry (its table of geometries is kept)."""
    state.active = None
    state.instances = []
    state.in_use = []


def _activate(state: model.MigState, geometry: int) -> None:
    state.active = geometry
    state.instances = flatten(state.geometries[geometry])
    state.in_use = [False] * len(state.instances)


def _first_free(state: model.MigState, memory_mib: int) -> int | None:
    """First fit: the lowest free slot whose instance has at least ``memory_mib``."""
    for slot, instance in enumerate(state.instances):
        if not state.in_use[slot] and instance.memory_mib >= memory_mib:
            return slot
    return None


def _choose_geometry(state: model.MigState, memory_mib: int) -> tuple[int, int] | None:
    """(geometry, slot) for the first allocation on an idle card, or None.

    Geometries are walked in order and, inside each, templates in order: the first template
    with enough memory wins and the task takes its first instance. This is the first
    geometry with *any* large-enough template, not the best-fitting one (HAMi's rule).
    """
    for index, geometry in enumerate(state.geometries):
        slot = 0
        for template in geometry:
            if template.count > 0 and template.memory_mib >= memory_mib:
                return index, slot
            slot += max(template.count, 0)
    return None


def _mark_unhealthy(device: model.DeviceUsage) -> None:
    # Fail closed: a running task we cannot place means the card's real partition is
    # unknown, so no new task may be put on it.
    device.health = False


def restore(device: model.DeviceUsage, geometry: int, slot: int) -> None:
    """Account a running task's instance ``[geometry-slot]`` on this card.

    Only the MIG state is updated; the caller books the entry's memory and cores as for
    any running task. The first restored entry activates its geometry; a later entry
    naming another geometry is ignored (HAMi's behaviour: the card can run only one).
    The card is marked unhealthy when it is not in ``mig`` mode (a MIG task on a
    ``hami-core`` card, as in HAMi), when the geometry does not exist in the card's table,
    or when the slot is outside the geometry.
    """
    state = device.mig
    if device.mode != model.MODE_MIG or state is None:
        _mark_unhealthy(device)
        return
    if state.active is None or needs_reset(state):
        if not 0 <= geometry < len(state.geometries):
            _mark_unhealthy(device)
            return
        _activate(state, geometry)
    elif geometry != state.active:
        return
    if not 0 <= slot < len(state.instances):
        _mark_unhealthy(device)
        return
    state.in_use[slot] = True


def custom_filter(
    device: model.DeviceUsage, request_memory_mib: int, picked_on_this_card: Sequence[int]
) -> bool:
    """Fit step 15 (``CustomFilterRule``): can this card give one more instance?

    Simulated on a copy, never mutating ``device``. An idle card (no geometry, or none in
    use) first takes the geometry an allocation would choose; then one free instance with
    memory >= the pick's request is taken for each earlier pick of this container on this
    card (``picked_on_this_card`` = those picks' requested memory in MiB, in pick order);
    the card passes when a free instance with ``request_memory_mib`` remains.
    Cards not in ``mig`` mode always pass. On failure the caller counts
    ``Reason.CARD_MIG_TOPOLOGY_INFEASIBLE`` (HAMi v2.10's name).
    """
    if device.mode != model.MODE_MIG:
        return True
    state = model.MigState() if device.mig is None else device.mig.copy()
    if needs_reset(state):
        reset(state)
        chosen = _choose_geometry(state, request_memory_mib)
        if chosen is None:
            return False
        _activate(state, chosen[0])
    for picked_memory_mib in picked_on_this_card:
        slot = _first_free(state, picked_memory_mib)
        if slot is None:
            return False
        state.in_use[slot] = True
    return _first_free(state, request_memory_mib) is not None


def allocate(device: model.DeviceUsage, request_memory_mib: int) -> tuple[str, int, int]:
    """Take an instance for one request (MIG part of ``AddResourceUsage``); mutates ``device.mig``.

    An idle card chooses its geometry (see ``custom_filter``) and the task takes the first
    instance of the first large-enough template; otherwise the task takes the first free
    instance with enough memory (first fit: a small task may take a big instance).
    Returns ``(instance uuid "ID[g-s]", instance memory_mib, instance cores)``; the caller
    books these instead of the request's. Raises ``MigAllocationError`` when nothing fits.
    """
    state = device.mig
    if device.mode != model.MODE_MIG or state is None:
        raise MigAllocationError(f"card {device.id} is not a MIG card")
    if needs_reset(state):
        reset(state)
        chosen = _choose_geometry(state, request_memory_mib)
        if chosen is None:
            raise MigAllocationError(
                f"card {device.id}: no geometry has an instance of {request_memory_mib} MiB"
            )
        _activate(state, chosen[0])
        slot: int | None = chosen[1]
    else:
        slot = _first_free(state, request_memory_mib)
    if slot is None or state.active is None:
        raise MigAllocationError(f"card {device.id}: no free instance of {request_memory_mib} MiB")
    state.in_use[slot] = True
    instance = state.instances[slot]
    return instance_uuid(device.id, state.active, slot), instance.memory_mib, instance.cores


def release(device: model.DeviceUsage, geometry: int, slot: int) -> None:
    """Free instance ``[geometry-slot]``; the geometry is released once all are free.

    Entries that do not name an instance of the active geometry are ignored. Usage is
    normally rebuilt from running pods (``restore``); this is for incremental bookkeeping.
    """
    state = device.mig
    if state is None or state.active != geometry or not 0 <= slot < len(state.in_use):
        return
    state.in_use[slot] = False
    if needs_reset(state):
        reset(state)


# --- HAMi v2.10's record of an instance: profile and placement --------------------------

#: NVIDIA's GPU-instance placements on A100 and H100, by the compute slices a profile
#: name starts with (``3g.40gb`` -> 3): the instance's size in memory slices (of 8) and
#: the starts it may take (NVML's ``GetGpuInstancePossiblePlacements``).
_PLACEMENT_RULES: Final = {
    1: (1, (0, 1, 2, 3, 4, 5, 6)),
    2: (2, (0, 2, 4)),
    3: (4, (0, 4)),
    4: (4, (0,)),
    7: (8, (0,)),
}
_PROFILE_RE: Final = re.compile(r"([0-9]+)g\.")


def _rule(profile: str) -> tuple[int, tuple[int, ...]] | None:
    match = _PROFILE_RE.match(profile)
    return None if match is None else _PLACEMENT_RULES.get(int(match.group(1)))


def placements(geometry: model.Geometry) -> list[tuple[int, int] | None]:
    """Per slot of the flattened geometry, its (start, size) in memory slices.

    The seed's geometries name their instances but not where each sits on the card, so a
    layout is chosen: every instance at a start NVIDIA allows, none overlapping, the
    earliest such layout in geometry order (``1g`` + 3 x ``2g`` puts the 1g at 6). A
    geometry with a profile name outside NVIDIA's ``Ng.…`` form, or that cannot be laid
    out, has no placements (all None).
    """
    instances = flatten(geometry)
    rules = [_rule(t.name) for t in instances]
    if any(r is None for r in rules):
        return [None] * len(instances)
    chosen: list[tuple[int, int]] = []

    def place(position: int, taken: int) -> bool:
        if position == len(rules):
            return True
        size, starts = rules[position] or (0, ())
        for start in starts:
            mask = ((1 << size) - 1) << start
            if taken & mask:
                continue
            chosen.append((start, size))
            if place(position + 1, taken | mask):
                return True
            chosen.pop()
        return False

    if not place(0, 0):
        return [None] * len(instances)
    return list(chosen)


def describe(
    geometries: Sequence[model.Geometry], geometry: int, slot: int
) -> tuple[str, int, int] | None:
    """(profile, start, size) of instance ``[geometry-slot]``, or None when unknown."""
    if not 0 <= geometry < len(geometries):
        return None
    instances = flatten(geometries[geometry])
    spots = placements(geometries[geometry])
    if not 0 <= slot < len(instances) or spots[slot] is None:
        return None
    start, size = spots[slot] or (0, 0)
    return instances[slot].name, start, size


def find_instance(
    geometries: Sequence[model.Geometry],
    profile: str,
    start: int,
    size: int,
    prefer: int | None = None,
) -> tuple[int, int] | None:
    """The (geometry, slot) whose instance has this profile and placement: in geometry
    ``prefer`` if it has one, else in the first geometry that does; None if none."""
    order = list(range(len(geometries)))
    if prefer is not None and 0 <= prefer < len(geometries):
        order.remove(prefer)
        order.insert(0, prefer)
    for geometry in order:
        for slot in range(len(flatten(geometries[geometry]))):
            if describe(geometries, geometry, slot) == (profile, start, size):
                return geometry, slot
    return None
