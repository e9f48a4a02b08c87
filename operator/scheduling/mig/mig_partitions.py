"""MIG instances on the DRA path: a node's partitionable devices, their shared counters,
and which instance a MIG profile request gets (pure).

A node's pool publishes, per MIG card, a counter set and one device per profile placement
that consumes counters from it (``devices.dra_mig``). Any device that consumes counters
may be allocated only while every counter it names has that much left (KEP-4815; upstream
never over-consumes a counter, and neither does this module: ``CounterLedger``).

Which instance a request gets follows the engine's MIG rules, not upstream's first fit:

- **fewest cards broken**: a card that already holds instances is used before an intact
  one, and among those the one left with the fewest free memory slices (its holes get
  filled, the intact cards stay whole for ``7g`` requests);
- **HAMi v2.10's profile order**: a request by memory takes the smallest profile (memory,
  then slices) that holds it; a request that names its profile takes that profile;
- **HAMi v2.10's placement order**: ``1g`` and ``3g`` instances from the highest start,
  the others from the lowest (so small instances gather at the card's end and leave its
  start to ``2g``/``4g``/``7g``); among placements equally good so, the one that leaves
  the card the most places for bigger profiles.

``first_fit`` is upstream's rule for comparison: the first device, in slice-name then
device order, whose counters are free.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from vgpu_operator.devices import dra, dra_mig
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import ResourceSlice, SliceDevice

#: counter set -> counter -> amount.
Counters = dict[str, dict[str, Fraction]]


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance placement as a pool publishes it."""

    name: str
    #: The slice it was published in (upstream's first fit walks slices by name).
    slice_name: str
    card: str
    card_index: int
    profile: str
    memory_mib: int
    start: int
    memory_slices: int
    compute_slices: int
    consumes: Mapping[str, Mapping[str, Fraction]]


@dataclass(slots=True)
class MigPool:
    """A node's MIG devices and the counter sets they consume from."""

    node: str
    devices: list[MigDevice] = field(default_factory=list)
    counters: Counters = field(default_factory=dict)
    #: Devices outside MIG that consume counters too (a card's share device when it is
    #: offered both ways): name -> what it consumes.
    other_consumers: dict[str, Mapping[str, Mapping[str, Fraction]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def by_name(self) -> dict[str, MigDevice]:
        return {d.name: d for d in self.devices}


def _amounts(raw: Any, where: str) -> dict[str, Fraction]:
    if not isinstance(raw, Mapping):
        raise CodecError("counters", f"{where} is not a map")
    out = {}
    for name, entry in raw.items():
        value = entry.get("value") if isinstance(entry, Mapping) else None
        amount = parse_quantity(value, f"{where}.{name}")
        if amount < 0:
            raise CodecError("counters", f"{where}.{name} is negative")
        out[str(name)] = amount
    return out


def _consumes(raw: SliceDevice, where: str) -> dict[str, dict[str, Fraction]]:
    out: dict[str, dict[str, Fraction]] = {}
    for entry in raw.get("consumesCounters") or ():
        if not isinstance(entry, Mapping):
            raise CodecError("counters", f"{where}: consumesCounters entry is not a map")
        name = str(entry.get("counterSet", ""))
        out[name] = _amounts(entry.get("counters"), f"{where}.consumesCounters[{name}]")
    return out


def read_mig_pool(node: str, slices: Iterable[ResourceSlice]) -> MigPool:
    """The node's MIG devices and counter sets from its slices (this driver's, the
    node's pool, newest generation only). A device naming a counter set or counter the
    pool does not hold is left out with a problem: it could never be allocated."""
    mine = []
    for item in slices:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        if spec.get("driver") != dra.DRIVER or pool.get("name") != node:
            continue
        name = str((item.get("metadata") or {}).get("name", ""))
        mine.append((int(pool.get("generation") or 0), name, spec))
    result = MigPool(node)
    if not mine:
        return result
    newest = max(g for g, _, _ in mine)
    current = sorted((n, s) for g, n, s in mine if g == newest)
    for _name, spec in current:
        for entry in spec.get("sharedCounters") or ():
            try:
                set_name = str(entry.get("name", ""))
                result.counters[set_name] = _amounts(entry.get("counters"), set_name)
            except (CodecError, AttributeError) as exc:
                result.problems.append(f"{node}: {exc}")
    for slice_name, spec in current:
        for raw in spec.get("devices") or ():
            if not isinstance(raw, Mapping) or not raw.get("consumesCounters"):
                continue
            where = f"device {raw.get('name')}"
            try:
                consumes = _consumes(raw, where)
            except CodecError as exc:
                result.problems.append(f"{node}: {exc}")
                continue
            unknown = [
                f"{s}/{c}"
                for s, counters in consumes.items()
                for c in counters
                if c not in result.counters.get(s, {})
            ]
            if unknown:
                result.problems.append(f"{node}: {where} consumes unknown counters {unknown}")
                continue
            device = _mig_device(raw, slice_name, consumes)
            if device is None:
                result.other_consumers[str(raw.get("name", ""))] = consumes
            else:
                result.devices.append(device)
    return result


def _attr(raw: SliceDevice, name: str) -> Any:
    typed = (raw.get("attributes") or {}).get(name)
    if not isinstance(typed, Mapping):
        return None
    for kind in ("int", "string", "bool", "version"):
        if kind in typed:
            return typed[kind]
    return None


def _mig_device(
    raw: SliceDevice, slice_name: str, consumes: Mapping[str, Mapping[str, Fraction]]
) -> MigDevice | None:
    profile = _attr(raw, dra_mig.ATTR_PROFILE)
    start = _attr(raw, dra_mig.ATTR_MIG_START)
    size = _attr(raw, dra_mig.ATTR_MIG_SIZE)
    compute = _attr(raw, dra_mig.ATTR_COMPUTE_SLICES)
    card = _attr(raw, dra_mig.ATTR_PARENT)
    if not (isinstance(profile, str) and isinstance(card, str)):
        return None
    if not all(isinstance(v, int) for v in (start, size, compute)):
        return None
    memory = ((raw.get("capacity") or {}).get(dra.MEMORY) or {}).get("value")
    try:
        memory_mib = int(parse_quantity(memory, "memory") // dra.MIB) if memory else 0
    except CodecError:
        return None
    return MigDevice(
        name=str(raw.get("name", "")),
        slice_name=slice_name,
        card=card,
        card_index=int(_attr(raw, dra.ATTR_INDEX) or 0),
        profile=profile,
        memory_mib=memory_mib,
        start=int(start),
        memory_slices=int(size),
        compute_slices=int(compute),
        consumes=consumes,
    )


class CounterLedger:
    """What is left of each counter while devices are allocated: never below zero."""

    def __init__(self, counters: Counters, total: Counters | None = None) -> None:
        self.left: Counters = {s: dict(c) for s, c in counters.items()}
        #: What the pool publishes (``left`` with nothing allocated).
        self.total: Counters = {s: dict(c) for s, c in counters.items()} if total is None else total

    def copy(self) -> CounterLedger:
        return CounterLedger(self.left, self.total)  # the total is never changed

    def fits(self, consumes: Mapping[str, Mapping[str, Fraction]]) -> bool:
        for set_name, counters in consumes.items():
            have = self.left.get(set_name)
            if have is None:
                return False
            for counter, amount in counters.items():
                if have.get(counter, Fraction(0)) < amount:
                    return False
        return True

    def take(self, consumes: Mapping[str, Mapping[str, Fraction]]) -> None:
        """Raises ValueError (nothing taken) when a counter would go below zero."""
        if not self.fits(consumes):
            raise ValueError("counters exhausted")
        for set_name, counters in consumes.items():
            for counter, amount in counters.items():
                self.left[set_name][counter] -= amount

    def give_back(self, consumes: Mapping[str, Mapping[str, Fraction]]) -> None:
        for set_name, counters in consumes.items():
            for counter, amount in counters.items():
                self.left[set_name][counter] += amount


def ledger_for(
    pool: MigPool, allocated: Iterable[str], shares_held: Iterable[str] = ()
) -> CounterLedger:
    """The pool's counters less what the allocated MIG devices, and the share devices that
    hold at least one share (``shares_held``: counted once however many), consume."""
    ledger = CounterLedger(pool.counters)
    by_name = pool.by_name
    for name in allocated:
        device = by_name.get(name)
        if device is not None:
            ledger.take(device.consumes)
    for name in set(shares_held):
        consumes = pool.other_consumers.get(name)
        if consumes is not None:
            ledger.take(consumes)
    return ledger


# --- which instance a request gets -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigAsk:
    """One MIG request: a profile by name, or the least memory it needs (MiB)."""

    profile: str | None = None
    memory_mib: int = 0
    #: Only these devices (a request's selectors allow them); None: any.
    allowed: frozenset[str] | None = None

    def matches(self, device: MigDevice) -> bool:
        if self.allowed is not None and device.name not in self.allowed:
            return False
        if self.profile is not None:
            return device.profile == self.profile
        return device.memory_mib >= self.memory_mib


#: A card's placements as the scoring sees them: per placement its memory slices and,
#: per counter it consumes, (the counter's position in the card's counter names, amount).
Layout = tuple[tuple[int, tuple[tuple[int, int], ...]], ...]


@dataclass(frozen=True, slots=True)
class _Card:
    """One card's counter set, its counter names, and its placements (``Layout``), in
    the order of ``devices``; or ``layout`` None when its devices use several sets (then
    placements are only fitted, not scored)."""

    counter_set: str
    names: tuple[str, ...]
    layout: Layout | None
    devices: tuple[MigDevice, ...]

    def state(self, left: Counters) -> tuple[int, ...]:
        """What is left of each counter, rounded down (whole counters are the scoring's
        unit; ``CounterLedger`` decides what fits, exactly)."""
        have = left.get(self.counter_set, {})
        return tuple(int(have.get(name, Fraction(0))) for name in self.names)


#: The cards of the device lists seen last (a pool's list is read once and offered to
#: every request on it): list identity -> (the list, its cards).
_CARDS_SEEN: dict[int, tuple[Sequence[MigDevice], list[_Card]]] = {}
_CARDS_SEEN_MAX = 256


def _cards(devices: Sequence[MigDevice]) -> list[_Card]:
    seen = _CARDS_SEEN.get(id(devices))
    if (
        seen is not None
        and seen[0] is devices
        and sum(len(c.devices) for c in seen[1]) == len(devices)
    ):
        return seen[1]
    if len(_CARDS_SEEN) >= _CARDS_SEEN_MAX:
        _CARDS_SEEN.clear()
    cards = _group(devices)
    _CARDS_SEEN[id(devices)] = (devices, cards)
    return cards


def _group(devices: Sequence[MigDevice]) -> list[_Card]:
    per_card: dict[str, list[MigDevice]] = {}
    for device in devices:
        per_card.setdefault(device.card, []).append(device)
    out = []
    for group in per_card.values():
        sets = {s for d in group for s in d.consumes}
        name = min(sets) if sets else ""
        names = tuple(sorted({c for d in group for c in d.consumes.get(name, {})}))
        layout: Layout | None = None
        whole = all(
            a.denominator == 1 for d in group for c in d.consumes.values() for a in c.values()
        )
        if len(sets) == 1 and whole:
            index = {c: i for i, c in enumerate(names)}
            layout = tuple(
                (d.memory_slices, tuple((index[c], int(a)) for c, a in d.consumes[name].items()))
                for d in group
            )
        out.append(_Card(name, names, layout, tuple(group)))
    return out


def _fits(takes: tuple[tuple[int, int], ...], state: tuple[int, ...]) -> bool:
    return all(state[i] >= amount for i, amount in takes)


@functools.lru_cache(maxsize=65536)  # states of one card model: at most 2^8 x 8 each
def _room(layout: Layout, state: tuple[int, ...]) -> int:
    """The placements that still fit, weighted by their memory slices: how much of the
    card later requests, big ones most, can still use."""
    return sum(size for size, takes in layout if _fits(takes, state))


def _after(takes: tuple[tuple[int, int], ...], state: tuple[int, ...]) -> tuple[int, ...]:
    left = list(state)
    for i, amount in takes:
        left[i] -= amount
    return tuple(left)


def _v210_rank(device: MigDevice) -> int:
    """HAMi v2.10's placement order: 1g and 3g from the highest start, others lowest."""
    high_first = device.profile.startswith(("1g.", "3g."))
    return -device.start if high_first else device.start


def choose(ask: MigAsk, devices: Sequence[MigDevice], ledger: CounterLedger) -> MigDevice | None:
    """The instance the engine gives ``ask`` (see the module's rules), or None."""
    scored: list[tuple[tuple[int, int, int, int, int, str], MigDevice]] = []
    candidates: list[tuple[_Card, int, MigDevice]] = []
    for card in _cards(devices):
        for position, device in enumerate(card.devices):
            if ask.matches(device) and ledger.fits(device.consumes):
                candidates.append((card, position, device))
    if not candidates:
        return None
    if ask.profile is None:
        # v2.10: the smallest profile that holds the request (memory, then slices).
        smallest = min((d.memory_mib, d.compute_slices) for _, _, d in candidates)
        candidates = [c for c in candidates if (c[2].memory_mib, c[2].compute_slices) == smallest]
    rooms: dict[str, tuple[int, int, tuple[int, ...]]] = {}
    for card, position, device in candidates:
        if card.layout is None:
            scored.append(((1, 0, 0, _v210_rank(device), device.card_index, device.name), device))
            continue
        if device.card not in rooms:
            state = card.state(ledger.left)
            whole = _room(card.layout, card.state(ledger.total))
            rooms[device.card] = (_room(card.layout, state), whole, state)
        before, whole, state = rooms[device.card]
        after = _room(card.layout, _after(card.layout[position][1], state))
        key = (
            int(before >= whole),  # fewest cards broken: a broken card first
            before - after,  # the choice that costs later requests least
            before,  # the fullest broken card first
            _v210_rank(device),
            device.card_index,
            device.name,
        )
        scored.append((key, device))
    return min(scored, key=lambda pair: pair[0])[1]


def first_fit(ask: MigAsk, devices: Sequence[MigDevice], ledger: CounterLedger) -> MigDevice | None:
    """Upstream's allocator: the first device in slice-name, then published, order."""
    for device in sorted(devices, key=lambda d: d.slice_name):  # stable: published order
        if ask.matches(device) and ledger.fits(device.consumes):
            return device
    return None
