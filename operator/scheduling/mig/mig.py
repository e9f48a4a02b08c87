"""MIG placement: which instance a container gets, and what a card's instances occupy.

A MIG card's instances are described in one of two ways:

- **the seed's geometries** (``knownMigGeometries`` in the device config, HAMi <= v2.9):
  ordered lists of templates (``1g.5gb`` x 7, ...) that each partition the card. The
  first task on an idle card chooses the geometry; the geometry stays until every
  instance is free again (seed 000 §2, hami-semantics §12.1). An instance is named by a
  ``[geometry-slot]`` suffix on the card's UUID.
- **the card's own profiles** (HAMi v2.10's ``migProfiles`` in the node registration):
  per profile, its memory and cores and every place (first memory slice, slices) an
  instance of it may take. An instance goes into the free place of the smallest profile
  that holds the request (hami-semantics §12.2). Inside the engine it is named by a
  ``[profile-placement]`` suffix (the indexes into the card's lists); on the wire it is
  the plain card UUID plus HAMi v2.10's ``hami.io/vgpu-mig-allocations`` entry.

Whatever names them, the instances a card holds occupy memory slices, and a new
instance goes only where no slice is taken. On a geometry card, instances that HAMi v2.10
placed outside the card's geometry (``mig_records``) are kept as ``spots`` (their
slices); while there are any, a new instance may come from any geometry as long as its
slices are free (the seed's layout of a geometry, ``placements``), so a card a cluster
brings from HAMi v2.10 stays usable and is never over-committed.

This module keeps ``DeviceUsage.mig`` up to date. It does not book memory, cores or time
slices on the card: the Fit engine does that, with the instance's memory and cores
(returned by ``allocate``) in place of the request's.

Deliberate differences from HAMi, each fixing a weakness (hami-semantics §14 item 8):

- ``custom_filter`` counts only the earlier picks of this container on *this* card (v2.9
  counted picks on any card, so a container spread over two MIG cards was refused).
- The suffix of a first allocation names the instance's slot in the flattened geometry
  (v2.9 wrote the template's position, wrong when an earlier template has count > 1).
- Templates with ``count <= 0`` are never chosen (they have no instance to take).
- ``restore`` fails closed on entries that cannot be placed (unknown geometry or profile,
  slot out of range, card not in MIG mode, an instance outside the active geometry whose
  slices are unknown): the card is marked unhealthy instead of indexing blindly. v2.9
  ignored an instance of another geometry and could hand its slices out again.
"""

from __future__ import annotations

import functools
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


@dataclass(frozen=True, slots=True)
class MigTable:
    """What a card's instances are named by: the profiles it publishes, when it does,
    else the geometries the device config gives its model."""

    geometries: tuple[model.Geometry, ...] = ()
    profiles: tuple[model.MigProfile, ...] = ()

    @property
    def published(self) -> bool:
        """Whether the card publishes its profiles (HAMi v2.10's form)."""
        return bool(self.profiles)


def instance_uuid(card_id: str, first: int, second: int) -> str:
    """The engine's id of one MIG instance: ``f"{card_id}[{first}-{second}]"`` (geometry
    and slot, or profile and placement on a card that publishes its profiles)."""
    return codec.join_mig_uuid(card_id, first, second, field="uuid")


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


def attach(
    device: model.DeviceUsage,
    known: Iterable[GeometryEntry],
    profiles: Sequence[model.MigProfile] = (),
) -> None:
    """Give a ``mig``-mode card what names its instances, with none taken yet: the
    profiles it publishes, or else its model's geometries.

    Cards in other modes are left untouched (their ``mig`` stays ``None``).
    """
    if device.mode == model.MODE_MIG:
        if profiles:
            device.mig = model.MigState(profiles=tuple(profiles))
        else:
            device.mig = model.MigState(geometries=geometries_for(device.type, known))


def flatten(geometry: model.Geometry) -> list[model.MigTemplate]:
    """The instances of a geometry: each template repeated ``count`` times, in order.

    HAMi's ``PlatternMIG``; slot ``s`` of a ``[g-s]`` suffix indexes this list.
    """
    return [template for template in geometry for _ in range(max(template.count, 0))]


def needs_reset(state: model.MigState) -> bool:
    """True when no instance is in use, so the next allocation may choose a geometry again."""
    return not any(state.in_use) and not state.spots


def reset(state: model.MigState) -> None:
    """Release the active geometry (its table of geometries is kept)."""
    state.active = None
    state.instances = []
    state.in_use = []


def _activate(state: model.MigState, geometry: int) -> None:
    state.active = geometry
    state.instances = flatten(state.geometries[geometry])
    state.in_use = [False] * len(state.instances)


def _mark_unhealthy(device: model.DeviceUsage) -> None:
    # Fail closed: a running task we cannot place means the card's real partition is
    # unknown, so no new task may be put on it.
    device.health = False


def _overlaps(spot: model.MigPlacement, taken: Iterable[model.MigPlacement]) -> bool:
    start, size = spot
    return any(start < s + n and s < start + size for s, n in taken)


# --- the seed's geometries --------------------------------------------------------------


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


def _taken_slices(state: model.MigState) -> list[model.MigPlacement] | None:
    """The slices of every instance on a geometry card; None when an instance in use
    has no known place (a profile outside NVIDIA's ``Ng.`` names)."""
    taken = list(state.spots)
    if state.active is not None and any(state.in_use):
        spots = placements(state.geometries[state.active])
        for slot, used in enumerate(state.in_use):
            if used:
                spot = spots[slot]
                if spot is None:
                    return None
                taken.append(spot)
    return taken


def _free_slot_anywhere(state: model.MigState, memory_mib: int) -> tuple[int, int] | None:
    """With instances outside one geometry on the card (``spots``), the instance to take:
    the first large-enough slot, in the active geometry first and then in geometry order,
    whose slices are all free."""
    taken = _taken_slices(state)
    if taken is None:
        return None
    busy = state.active is not None and any(state.in_use)
    order = list(range(len(state.geometries)))
    if busy and state.active is not None:
        order.remove(state.active)
        order.insert(0, state.active)
    for geometry in order:
        spots = placements(state.geometries[geometry])
        for slot, instance in enumerate(flatten(state.geometries[geometry])):
            if instance.memory_mib < memory_mib or spots[slot] is None:
                continue
            if busy and geometry == state.active and state.in_use[slot]:
                continue
            if not _overlaps(spots[slot] or (0, 0), taken):
                return geometry, slot
    return None


def _take_from_geometries(state: model.MigState, memory_mib: int) -> tuple[int, int] | None:
    """Choose and take the instance for one request on a geometry card: (geometry, slot)."""
    if needs_reset(state):
        reset(state)
        chosen = _choose_geometry(state, memory_mib)
        if chosen is None:
            return None
        _activate(state, chosen[0])
    elif not state.spots:
        slot = _first_free(state, memory_mib)
        if slot is None or state.active is None:
            return None
        chosen = (state.active, slot)
    else:
        chosen = _free_slot_anywhere(state, memory_mib)
        if chosen is None:
            return None
        if not any(state.in_use):
            _activate(state, chosen[0])
    geometry, slot = chosen
    if geometry == state.active:
        state.in_use[slot] = True
    else:
        spot = placements(state.geometries[geometry])[slot]
        state.spots.append(spot or (0, 0))  # _free_slot_anywhere only offers known places
    return chosen


# --- HAMi v2.10's profiles and placements -----------------------------------------------


def _placement_order(profile: model.MigProfile) -> list[int]:
    """HAMi v2.10's balanced packing: ``1g`` and ``3g`` instances are tried from the
    highest start, the others from the lowest (indexes into ``profile.placements``)."""
    high_first = profile.name.startswith(("1g.", "3g."))
    indexes = list(range(len(profile.placements)))
    return sorted(
        indexes,
        key=lambda k: -profile.placements[k][0] if high_first else profile.placements[k][0],
    )


def _take_from_profiles(state: model.MigState, memory_mib: int) -> tuple[int, int] | None:
    """HAMi v2.10's ``selectMigCandidate``: the smallest profile (memory, then slices,
    then published order) with at least ``memory_mib`` that has a free place; takes it:
    (profile, placement). Profile names are unique on a card (``plausibility``)."""
    profiles = state.profiles
    order = sorted(
        range(len(profiles)), key=lambda i: (profiles[i].memory_mib, profiles[i].slice_count)
    )
    for index in order:
        profile = profiles[index]
        if profile.memory_mib < memory_mib:
            continue
        for k in _placement_order(profile):
            if not _overlaps(profile.placements[k], state.spots):
                state.spots.append(profile.placements[k])
                return index, k
    return None


# --- the card's state: restore, filter, allocate ----------------------------------------


def _take(state: model.MigState, memory_mib: int) -> tuple[int, int] | None:
    if state.profiles:
        return _take_from_profiles(state, memory_mib)
    return _take_from_geometries(state, memory_mib)


def restore(device: model.DeviceUsage, first: int, second: int) -> None:
    """Account a running task's instance ``[first-second]`` on this card.

    Only the MIG state is updated; the caller books the entry's memory and cores as for
    any running task. On a card that publishes its profiles the instance is profile
    ``first``'s placement ``second``. On a geometry card the first restored entry
    activates its geometry; an entry of another geometry occupies its slices (a spot).
    The card is marked unhealthy when it is not in ``mig`` mode (a MIG task on a
    ``hami-core`` card, as in HAMi), when the profile, geometry or slot does not exist,
    or when the slices of an instance outside the active geometry are unknown.
    """
    state = device.mig
    if device.mode != model.MODE_MIG or state is None:
        _mark_unhealthy(device)
        return
    if state.profiles:
        if not 0 <= first < len(state.profiles):
            _mark_unhealthy(device)
            return
        spots = state.profiles[first].placements
        if not 0 <= second < len(spots):
            _mark_unhealthy(device)
            return
        state.spots.append(spots[second])
        return
    if not 0 <= first < len(state.geometries):
        _mark_unhealthy(device)
        return
    if state.active is None or not any(state.in_use):
        _activate(state, first)
    elif first != state.active:
        described = describe(MigTable(state.geometries), first, second)
        if described is None:
            _mark_unhealthy(device)
            return
        state.spots.append(described[1:])
        return
    if not 0 <= second < len(state.instances):
        _mark_unhealthy(device)
        return
    state.in_use[second] = True


def occupy(device: model.DeviceUsage, start: int, size: int) -> None:
    """Account an instance known only by its slices (HAMi v2.10 placed it, and nothing
    the card's table names matches it). A card not in ``mig`` mode is marked unhealthy."""
    if device.mode != model.MODE_MIG or device.mig is None:
        _mark_unhealthy(device)
        return
    device.mig.spots.append((start, size))


def custom_filter(
    device: model.DeviceUsage, request_memory_mib: int, picked_on_this_card: Sequence[int]
) -> bool:
    """Fit step 15 (``CustomFilterRule``): can this card give one more instance?

    Simulated on a copy, never mutating ``device``: the earlier picks of this container
    on this card (``picked_on_this_card``, their requested memory in MiB, in pick order)
    take their instances as ``allocate`` would, then the card passes when an instance
    with ``request_memory_mib`` remains. Cards not in ``mig`` mode always pass. On
    failure the caller counts ``Reason.CARD_MIG_TOPOLOGY_INFEASIBLE`` (HAMi v2.10's name).
    """
    if device.mode != model.MODE_MIG:
        return True
    state = model.MigState() if device.mig is None else device.mig.copy()
    for picked_memory_mib in picked_on_this_card:
        if _take(state, picked_memory_mib) is None:
            return False
    return _take(state, request_memory_mib) is not None


def allocate(device: model.DeviceUsage, request_memory_mib: int) -> tuple[str, int, int]:
    """Take an instance for one request (MIG part of ``AddResourceUsage``); mutates ``device.mig``.

    A card that publishes its profiles gives the smallest profile that holds the request,
    in its free place (HAMi v2.10). A geometry card that is idle chooses its geometry
    (the first with a large-enough template) and the task takes that template's first
    instance; otherwise the task takes the first free instance with enough memory (first
    fit: a small task may take a big instance), or, with instances of other geometries on
    the card, the first large-enough instance whose slices are free.
    Returns ``(instance id "ID[a-b]", instance memory_mib, instance cores)``; the caller
    books these instead of the request's. Raises ``MigAllocationError`` when nothing fits.
    """
    state = device.mig
    if device.mode != model.MODE_MIG or state is None:
        raise MigAllocationError(f"card {device.id} is not a MIG card")
    taken = _take(state, request_memory_mib)
    if taken is None:
        raise MigAllocationError(f"card {device.id}: no free instance of {request_memory_mib} MiB")
    first, second = taken
    if state.profiles:
        profile = state.profiles[first]
        memory, cores = profile.memory_mib, profile.cores
    else:
        template = flatten(state.geometries[first])[second]
        memory, cores = template.memory_mib, template.cores
    return instance_uuid(device.id, first, second), memory, cores


def release(device: model.DeviceUsage, geometry: int, slot: int) -> None:
    """Free instance ``[geometry-slot]`` of a geometry card; the geometry is released once
    all are free.

    Entries that do not name an instance of the active geometry are ignored. Usage is
    normally rebuilt from running pods (``restore``); this is for incremental bookkeeping.
    """
    state = device.mig
    if state is None or state.active != geometry or not 0 <= slot < len(state.in_use):
        return
    state.in_use[slot] = False
    if needs_reset(state):
        reset(state)


# --- where a geometry's instances sit, and HAMi v2.10's record of them ------------------

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


def placements(geometry: model.Geometry) -> list[model.MigPlacement | None]:
    """Per slot of the flattened geometry, its (start, size) in memory slices.

    The seed's geometries name their instances but not where each sits on the card, so a
    layout is chosen: every instance at a start NVIDIA allows, none overlapping, the
    earliest such layout in geometry order (``1g`` + 3 x ``2g`` puts the 1g at 6). A
    geometry with a profile name outside NVIDIA's ``Ng.…`` form, or that cannot be laid
    out, has no placements (all None).
    """
    return list(_placements(geometry))


@functools.lru_cache(maxsize=1024)  # a config holds a handful of geometries
def _placements(geometry: model.Geometry) -> tuple[model.MigPlacement | None, ...]:
    instances = flatten(geometry)
    rules = [_rule(t.name) for t in instances]
    chosen: list[model.MigPlacement] = []

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

    if any(r is None for r in rules) or not place(0, 0):
        return (None,) * len(instances)
    return tuple(chosen)


def describe(table: MigTable, first: int, second: int) -> tuple[str, int, int] | None:
    """(profile, start, size) of instance ``[first-second]``, or None when unknown."""
    if table.published:
        if not 0 <= first < len(table.profiles):
            return None
        profile = table.profiles[first]
        if not 0 <= second < len(profile.placements):
            return None
        start, size = profile.placements[second]
        return profile.name, start, size
    if not 0 <= first < len(table.geometries):
        return None
    instances = flatten(table.geometries[first])
    spots = _placements(table.geometries[first])
    if not 0 <= second < len(instances) or spots[second] is None:
        return None
    start, size = spots[second] or (0, 0)
    return instances[second].name, start, size


def find_instance(
    table: MigTable,
    profile: str,
    start: int,
    size: int,
    prefer: int | None = None,
) -> tuple[int, int] | None:
    """The ``[first-second]`` instance with this profile and placement: on a geometry
    card, in geometry ``prefer`` if it has one, else in the first geometry that does;
    None if the table has no such instance."""
    if table.published:
        for index, published in enumerate(table.profiles):
            if published.name == profile and (start, size) in published.placements:
                return index, published.placements.index((start, size))
        return None
    order = list(range(len(table.geometries)))
    if prefer is not None and 0 <= prefer < len(table.geometries):
        order.remove(prefer)
        order.insert(0, prefer)
    for geometry in order:
        for slot in range(len(flatten(table.geometries[geometry]))):
            if describe(table, geometry, slot) == (profile, start, size):
                return geometry, slot
    return None
