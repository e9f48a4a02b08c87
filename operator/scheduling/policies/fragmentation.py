"""Fragmentation as FGD measures it, against the mix of requests the cluster sees.

FGD (Weng et al., "Beware of Fragmentation", USENIX ATC '23) calls a node's free GPU
capacity fragmented for a request when that request cannot use it: all of it when the
request does not fit the node at all (too few cards able to host it, or too little CPU
or memory left on the node), else the free part of each card that cannot host the
request's share. A node's fragmentation is that amount expected over the workload's
requests (weighted by how often each is seen); the ``fragmentation`` policy places each
pod where its placement raises it least.

Here every dimension a request needs counts: a card hosts a share when it has a free
slot, the share's cores and its memory (MiB, or a percentage of that card's memory);
the node's CPU and memory decide whether the request fits the node at all. A card's free
capacity is the smaller of its free fractions of cores and memory (what a share can
still use), and a card whose slots are all taken keeps its free capacity, all of it
stranded.

The mix (``WorkloadMix``) is learned online from the requests of recent pods (a bounded
window), started from a prior of common sizes that fades as pods are seen; its classes
are recomputed every ``refresh_every`` pods, not on each, so that the measures cached
per node state stay valid between refreshes. Pure arithmetic over ``DeviceUsage``:
the node walk that uses it is ``fragmentation_order``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from vgpu_operator.devices import model

#: Card types a request accepts (``use-gputype``: upper-case parts of the type name, any
#: of which the card's type must contain; empty: any type).
Types = tuple[str, ...]
#: One request as the mix sees it: vendor word ("" for any), cards, MiB per card,
#: percentage of a card's memory per card (-1 when in MiB), cores per card, the pod's
#: CPU (cores) and memory (bytes), and the card types it accepts.
Klass = tuple[str, int, int, int, int, float, float, Types]
#: The classes with their weights (summing to at most 1).
Classes = tuple[tuple[float, Klass], ...]
#: A request of a job as ``placement.Job.needs`` lists it (vendor, count, MiB, %, cores).
Need = tuple[str, int, int, int, int]

_GIB: Final = float(1 << 30)
#: The card score of a card that cannot host the share (below any rise: tried last; finite,
#: so that a score printed by ``simulate`` stays JSON).
_UNABLE: Final = -1e6

#: The prior: whole cards (one, two, four, eight) and shares of a half, a quarter and
#: a tenth of a card (as percentage and cores), with modest CPU and memory; what a GPU
#: cluster's requests mostly look like before any has been seen.
PRIOR: Final[Classes] = (
    (0.30, ("", 1, 0, 100, 100, 4.0, 16 * _GIB, ())),
    (0.10, ("", 2, 0, 100, 100, 8.0, 32 * _GIB, ())),
    (0.05, ("", 4, 0, 100, 100, 16.0, 64 * _GIB, ())),
    (0.05, ("", 8, 0, 100, 100, 32.0, 128 * _GIB, ())),
    (0.20, ("", 1, 0, 50, 50, 4.0, 16 * _GIB, ())),
    (0.20, ("", 1, 0, 25, 25, 2.0, 8 * _GIB, ())),
    (0.10, ("", 1, 0, 10, 10, 1.0, 4 * _GIB, ())),
)


#: A card as the measure reads it: vendor, a free slot, free cores, free MiB, total MiB,
#: its free capacity (``free_capacity``), total cores and its type (upper case).
CardState = tuple[str, bool, int, int, int, float, int, str]


def free_capacity(card: model.DeviceUsage) -> float:
    """The card's free capacity as a fraction of a card: the smaller of its free cores and
    free memory fractions (an unhealthy card offers none)."""
    if not card.health or card.total_memory_mib <= 0:
        return 0.0
    memory = (card.total_memory_mib - card.used_memory_mib) / card.total_memory_mib
    if card.total_cores > 0:
        memory = min(memory, (card.total_cores - card.used_cores) / card.total_cores)
    return memory if memory > 0.0 else 0.0


def state_of(card: model.DeviceUsage) -> CardState:
    return (
        card.vendor,
        card.health and card.used < card.count,
        card.total_cores - card.used_cores,
        card.total_memory_mib - card.used_memory_mib,
        card.total_memory_mib,
        free_capacity(card),
        card.total_cores,
        card.type.upper(),
    )


def hosts(card: model.DeviceUsage, vendor: str, mib: int, percent: int, cores: int) -> bool:
    """Whether the card can take one share of this size now."""
    return _hosts(state_of(card), vendor, mib, percent, cores)


def _hosts(
    state: CardState, vendor: str, mib: int, percent: int, cores: int, types: Types = ()
) -> bool:
    card_vendor, slot, free_cores, free_mib, total_mib, _free, _cores, card_type = state
    if not slot or free_cores < cores or (vendor and card_vendor != vendor):
        return False
    if types and not any(part in card_type for part in types):
        return False
    return free_mib >= (total_mib * percent // 100 if percent >= 0 else mib)


def _taken(state: CardState, mib: int, percent: int, cores: int) -> CardState:
    """The card after one share of the request (slots are not counted down: a card's
    last slot is rare next to its cores and memory, and Fit checks it anyway)."""
    vendor, slot, free_cores, free_mib, total_mib, _free, total_cores, card_type = state
    memory = total_mib * percent // 100 if percent >= 0 else mib
    free_cores -= min(cores, total_cores)
    free_mib -= memory
    free = 0.0
    if total_mib > 0:
        free = free_mib / total_mib
        if total_cores > 0:
            free = min(free, free_cores / total_cores)
    return (vendor, slot, free_cores, free_mib, total_mib, max(free, 0.0), total_cores, card_type)


class Vector:
    """A node's cards measured against each class, CPU and memory aside: per class what
    it could use (nothing when too few cards can host it), how much of a card one of its
    pods fills, and the CPU and memory that using all of it takes; the free total; and
    the measure of a node with CPU and memory to spare for every class (``spare``)."""

    __slots__ = ("memo", "parts", "spare", "total", "unblocked")

    def __init__(self, states: Sequence[CardState], classes: Classes) -> None:
        total = 0.0
        card_mib = 0
        for state in states:
            total += state[5]
            card_mib = max(card_mib, state[4])
        parts: list[_Part] = []
        unblocked = spare_cpu = spare_ram = 0.0
        for weight, (vendor, count, mib, percent, cores, cpu, ram, types) in classes:
            can = 0.0
            if count > 0 and total > 0.0:
                able = 0
                for state in states:
                    if _hosts(state, vendor, mib, percent, cores, types):
                        able += 1
                        can += state[5]
                if able < count:
                    can = 0.0
            fill = _fill(count, mib, percent, cores, card_mib)
            pods = math.ceil(can / fill - 1e-9) if can > 0.0 and fill > 0.0 else 1
            base = weight * (total - can) if count > 0 else 0.0
            parts.append((weight, cpu, ram, base, can, fill, cpu * pods, ram * pods))
            unblocked += base
            spare_cpu = max(spare_cpu, cpu * pods)
            spare_ram = max(spare_ram, ram * pods)
        self.parts = tuple(parts)
        self.total = total
        self.unblocked = unblocked
        self.spare: Spare = (spare_cpu, spare_ram)
        #: The measure per CPU and memory free, for the last few asked (nodes alike in
        #: cards and use share a vector: the empty ones of a kind, above all).
        self.memo: dict[tuple[float, float], float] = {}

    def expected(self, free_cpu: float, free_ram: float) -> float:
        """The node's expected fragmented capacity with this much CPU and memory free: a
        class uses at most as much of the cards as the pods of it that the CPU and
        memory left can run (none: all of the free capacity is stranded for it)."""
        if free_cpu >= self.spare[0] and free_ram >= self.spare[1]:
            return self.unblocked
        memo = self.memo
        value = memo.get((free_cpu, free_ram))
        if value is None:
            if len(memo) >= _VECTOR_MEMO:
                memo.clear()
            value = memo[free_cpu, free_ram] = self._expected(free_cpu, free_ram)
        return value

    def _expected(self, free_cpu: float, free_ram: float) -> float:
        expected = 0.0
        total = self.total
        for weight, cpu, ram, base, can, fill, all_cpu, all_ram in self.parts:
            if free_cpu >= all_cpu and free_ram >= all_ram:
                expected += base
            elif cpu > free_cpu or ram > free_ram:
                expected += weight * total
            elif fill > 0.0:
                pods = min(
                    free_cpu // cpu if cpu > 0 else math.inf,
                    free_ram // ram if ram > 0 else math.inf,
                )
                expected += weight * (total - min(can, pods * fill))
        return expected


#: CPU-and-memory pairs a vector keeps its measure for.
_VECTOR_MEMO: Final = 16
#: One class against a node's cards: weight, its pods' CPU and memory, its weighted
#: stranded capacity with CPU and memory to spare, the capacity it could use, the cards
#: one pod fills, and the CPU and memory that using all of it takes.
_Part = tuple[float, float, float, float, float, float, float, float]


def _fill(count: int, mib: int, percent: int, cores: int, card_mib: int) -> float:
    """How much of the cards one pod of the class takes (in cards): its share of a card,
    the larger of cores and memory, times its cards. Shares count in proportion as whole
    cards do: a node whose CPU runs out before its cards strands the rest for them too
    (FGD's replay, list gpushare100, seed 42: 13.86 % unallocated with shares as a
    threshold, 13.28 % in proportion; FGD 13.49 %). Once, before classes were weighed
    by the nodes that hold enough cards (``scarcity_weighted``), this cost the 8-card
    pods of list multigpu20 (6.69 %); with it, 3.78 %."""
    if count <= 0:
        return 0.0
    share = percent / 100 if percent >= 0 else (mib / card_mib if card_mib > 0 else 1.0)
    return count * min(1.0, max(share, cores / 100))


#: The CPU and memory a node needs free for no class to be held back by them.
Spare = tuple[float, float]


def node_fragmentation(
    cards: Sequence[model.DeviceUsage], free_cpu: float, free_ram: float, classes: Classes
) -> float:
    """The node's expected fragmented capacity (in cards) over the mix's classes."""
    vector = Vector([state_of(c) for c in cards], classes)
    return vector.expected(free_cpu, free_ram)


def _card_part(state: CardState, classes: Classes) -> float:
    """The card's own part of the measure: its free capacity that the classes' shares
    cannot use (the node's CPU, memory and card count left out)."""
    free = state[5]
    if free <= 0.0:
        return 0.0
    unable = 0.0
    for weight, (vendor, count, mib, percent, cores, _cpu, _ram, types) in classes:
        if count > 0 and not _hosts(state, vendor, mib, percent, cores, types):
            unable += weight
    return unable * free


def _card_rise(state: CardState, need: Need, classes: Classes) -> float:
    _vendor, _count, mib, percent, cores = need
    return _card_part(_taken(state, mib, percent, cores), classes) - _card_part(state, classes)


def card_order_key(
    cards: Sequence[model.DeviceUsage], need: Need, classes: Classes
) -> dict[str, float]:
    """Per card, the sort score under the ``fragmentation`` GPU policy: Fit tries the last
    card of the ascending sort first, so the score is minus the card's rise in
    fragmentation (cards that cannot host the share sort first, tried last)."""
    vendor, _count, mib, percent, cores = need
    scores: dict[str, float] = {}
    for card in cards:
        state = state_of(card)
        if _hosts(state, vendor, mib, percent, cores):
            scores[card.id] = -_card_rise(state, need, classes)
        else:
            scores[card.id] = _UNABLE
    return scores


def after_placing(
    states: Sequence[CardState], needs: Sequence[Need], classes: Classes, types: Types = ()
) -> list[CardState] | None:
    """The cards after the pod's requests, each share on the card it raises least (as the
    ``fragmentation`` GPU policy chooses) among the card ``types`` the pod accepts; None
    when too few cards can host a request."""
    return _after_placing(states, needs, types, lambda state: _card_part(state, classes))


def _after_placing(
    states: Sequence[CardState],
    needs: Sequence[Need],
    types: Types,
    part: Callable[[CardState], float],
) -> list[CardState] | None:
    work = list(states)
    for vendor, count, mib, percent, cores in needs:
        able = [
            (part(_taken(state, mib, percent, cores)) - part(state), position)
            for position, state in enumerate(work)
            if _hosts(state, vendor, mib, percent, cores, types)
        ]
        if len(able) < count:
            return None
        able.sort()
        for _rise, position in able[:count]:
            work[position] = _taken(work[position], mib, percent, cores)
    return work


def placement_delta(
    cards: Sequence[model.DeviceUsage],
    needs: Sequence[Need],
    free_cpu: float,
    free_ram: float,
    cpu: float,
    ram: float,
    classes: Classes,
    types: Types = (),
) -> float | None:
    """How much the node's fragmentation rises if the pod goes there (None: the estimate
    finds no room: too few cards for a request, too little CPU or memory)."""
    if cpu > free_cpu or ram > free_ram:
        return None
    states = [state_of(c) for c in cards]
    after = after_placing(states, needs, classes, types)
    if after is None:
        return None
    before = Vector(states, classes).expected(free_cpu, free_ram)
    return Vector(after, classes).expected(free_cpu - cpu, free_ram - ram) - before


#: Entries a ``Measure`` memoizes per table before it starts afresh.
_MEMO_MAX: Final = 200_000


class Measure:
    """The measure against one set of classes, memoized on content: card states and the
    card sets of nodes repeat across a cluster (nodes of one model, empty or alike), so
    each distinct one is measured once per mix."""

    def __init__(self, classes: Classes) -> None:
        self.classes = classes
        self._parts: dict[CardState, float] = {}
        self._vectors: dict[tuple[CardState, ...], Vector] = {}
        self._after: dict[
            tuple[tuple[CardState, ...], tuple[Need, ...], Types], tuple[CardState, ...] | None
        ] = {}

    def vector(self, states: tuple[CardState, ...]) -> Vector:
        vector = self._vectors.get(states)
        if vector is None:
            if len(self._vectors) >= _MEMO_MAX:
                self._vectors.clear()
            vector = self._vectors[states] = Vector(states, self.classes)
        return vector

    def after(
        self, states: tuple[CardState, ...], needs: tuple[Need, ...], types: Types = ()
    ) -> tuple[CardState, ...] | None:
        """``after_placing``, memoized; the result sorted as node states are."""
        key = (states, needs, types)
        if key in self._after:
            return self._after[key]
        if len(self._after) >= _MEMO_MAX:
            self._after.clear()
        placed = _after_placing(states, needs, types, self._part)
        result = None if placed is None else tuple(sorted(placed))
        self._after[key] = result
        return result

    def _part(self, state: CardState) -> float:
        part = self._parts.get(state)
        if part is None:
            if len(self._parts) >= _MEMO_MAX:
                self._parts.clear()
            part = self._parts[state] = _card_part(state, self.classes)
        return part


#: A class's key: its GPU shape, and its CPU (cores) and memory (GiB) as powers of two
#: (the next at or above): pods of one GPU shape ask very different CPU and memory, and
#: a node with 6 cores left fits the shape's 4-core pods, not its 16-core ones.
_Key = tuple[Need, int, int, Types]


def _key(klass: Klass) -> _Key:
    return (klass[:5], _octave(klass[5]), _octave(klass[6] / _GIB), klass[7])


def _octave(value: float) -> int:
    return 0 if value <= 1.0 else math.ceil(math.log2(value))


#: A card as the census counts it: its vendor, its type (upper case) and how many cards
#: of that vendor and type its node holds.
CensusKey = tuple[str, str, int]
#: The cluster's cards per ``CensusKey``, as ``scarcity_weighted`` reads it.
Census = Mapping[CensusKey, int]
#: A class's weight is raised at most this many times for the scarcity of its cards.
_SCARCITY_MAX: Final = 32.0


def scarcity_weighted(classes: Classes, census: Census) -> Classes:
    """The classes, each weight times how scarce the cards it can use are: the cluster's
    cards over the cards of the vendor and types it accepts on nodes holding at least
    as many of them as it asks (at most ``_SCARCITY_MAX``).

    FGD weighs a class by how often it is asked, whatever it may use. A class that
    accepts a few card models only (``use-gputype``) asks all of its demand of those
    cards, so a card it can use is worth that many times more to it than a card is to a
    class that takes any: weighed so, a pod that can go anywhere stays off the models the
    constrained pods need (FGD's replay, lists with card-model constraints: 15.41 % of
    GPUs left idle on gpuspec33 unweighted, 9.14 % weighted, FGD 12.10 %). So too a
    class of many cards: an 8-card pod can use the cards of 8-card nodes only (list
    multigpu50, seed 42: 3.13 % unweighted, 3.01 % weighted, FGD 3.04 %). A class
    that can use every card, or none the census holds, keeps its weight."""
    total = sum(census.values())
    if total <= 0:
        return classes
    out: list[tuple[float, Klass]] = []
    for weight, klass in classes:
        vendor, count, types = klass[0], klass[1], klass[7]
        if count > 0:
            able = sum(
                cards
                for (card_vendor, card_type, alike), cards in census.items()
                if alike >= count
                and (not vendor or card_vendor == vendor)
                and (not types or any(part in card_type for part in types))
            )
            if 0 < able < total:
                weight *= min(_SCARCITY_MAX, total / able)
        out.append((weight, klass))
    return tuple(out)


class WorkloadMix:
    """The requests recent pods made, as weighted classes.

    A window of the last ``window`` pods' requests plus the prior's pseudo-counts
    (``prior_weight`` pods' worth); a class is a GPU shape (vendor, cards, share) and a
    size of CPU and memory (``_key``), with the mean CPU and memory its pods asked; the
    ``top`` most frequent are kept. Every
    ``refresh_every`` pods the weights are recomputed, and taken (``version`` moves,
    which drops the measures cached against the old ones) only when they moved by more
    than ``drift`` (total variation): a steady workload keeps its caches. ``weighted``
    are the classes the measure uses: weighed by the scarcity of the cards each accepts
    in the cluster's ``census`` (``take_census``).
    """

    def __init__(
        self,
        window: int = 4096,
        top: int = 48,
        refresh_every: int = 128,
        prior: Classes = PRIOR,
        prior_weight: float = 64.0,
        drift: float = 0.05,
    ) -> None:
        if window < 1 or top < 1 or refresh_every < 1:
            raise ValueError("window, top and refresh_every must be positive")
        self._recent: deque[Klass] = deque(maxlen=window)
        #: Per GPU shape and size of CPU and memory (``_key``): pods in the window, and
        #: their CPU and memory summed.
        self._counts: dict[_Key, list[float]] = {}
        self._top = top
        self._refresh_every = refresh_every
        self._prior = prior
        self._prior_weight = prior_weight
        self._drift = drift
        self._pending = 0
        self.version = 0
        self._classes: Classes = self._weigh()
        self._census: dict[CensusKey, int] = {}
        self._weighted = self._classes

    @property
    def classes(self) -> Classes:
        """The classes as learned: weights are how often each is asked (summing to 1)."""
        return self._classes

    @property
    def weighted(self) -> Classes:
        """The classes the measure weighs (``scarcity_weighted`` by the census)."""
        return self._weighted

    def take_census(self, census: Census) -> None:
        """The cluster's cards per vendor and type; ``version`` moves when the weights do."""
        if census == self._census:
            return
        self._census = dict(census)
        weighted = scarcity_weighted(self._classes, self._census)
        if weighted != self._weighted:
            self._weighted = weighted
            self.version += 1

    def observe(self, klass: Klass) -> None:
        """One more request seen; the classes are reconsidered every ``refresh_every``."""
        if len(self._recent) == self._recent.maxlen:
            self._count(self._recent[0], -1)
        self._recent.append(klass)
        self._count(klass, 1)
        self._pending += 1
        if self._pending >= self._refresh_every:
            self._pending = 0
            weighed = self._weigh()
            if _distance(weighed, self._classes) > self._drift:
                self._classes = weighed
                self._weighted = scarcity_weighted(weighed, self._census)
                self.version += 1

    def _count(self, klass: Klass, sign: int) -> None:
        key = _key(klass)
        entry = self._counts.setdefault(key, [0.0, 0.0, 0.0])
        entry[0] += sign
        entry[1] += sign * klass[5]
        entry[2] += sign * klass[6]
        if entry[0] <= 0:
            del self._counts[key]

    def _weigh(self) -> Classes:
        weights: dict[Klass, float] = {}
        for weight, klass in self._prior:
            weights[klass] = weights.get(klass, 0.0) + weight * self._prior_weight
        for key, (count, cpu, ram) in self._counts.items():
            klass = (*key[0], cpu / count, ram / count, key[3])
            weights[klass] = weights.get(klass, 0.0) + count
        kept = sorted(weights.items(), key=lambda kw: -kw[1])[: self._top]
        total = sum(w for _k, w in kept)
        if total <= 0:
            return ()
        return tuple((w / total, k) for k, w in kept)


def _distance(a: Classes, b: Classes) -> float:
    """Total variation between two mixes' weights per class key (a class's mean CPU and
    memory drift with every pod; only a material change is worth new caches)."""
    weights: dict[_Key, float] = {}
    for weight, klass in a:
        weights[_key(klass)] = weights.get(_key(klass), 0.0) + weight
    for weight, klass in b:
        weights[_key(klass)] = weights.get(_key(klass), 0.0) - weight
    return sum(abs(w) for w in weights.values()) / 2


#: A learned class as the metrics label it: vendor, cards, memory per card, cores.
ShapeLabels = tuple[str, str, str, str]


def learned_shares(classes: Classes) -> dict[ShapeLabels, float]:
    """What the mix has learned, for ``vgpu_operator_fragmentation_learned_share``: each
    GPU shape's weight (classes of one shape but different CPU, memory or card types
    summed), at most ``WorkloadMix``'s ``top`` shapes, so the labels stay few."""
    out: dict[ShapeLabels, float] = {}
    for weight, (vendor, count, mib, percent, cores, _cpu, _ram, _types) in classes:
        memory = f"{percent}%" if percent >= 0 else f"{mib}Mi"
        labels = (vendor or "any", str(count), memory if count else "none", str(cores))
        out[labels] = out.get(labels, 0.0) + weight
    return out


def klass_of(needs: Sequence[Need], cpu: float, ram: float, types: Types = ()) -> Klass | None:
    """The pod's class: its largest request (cards times share), with the pod's CPU and
    memory and the card types it accepts; a pod that asks for no card is a class of no
    cards (its CPU and memory can still leave a node's cards unusable for the others:
    FGD counts such tasks too)."""
    if not needs:
        return ("", 0, 0, -1, 0, cpu, ram, ())
    vendor, count, mib, percent, cores = max(
        needs, key=lambda n: (n[1] * max(n[3], 0), n[1] * n[2], n[1] * n[4])
    )
    return (vendor, count, mib, percent, cores, cpu, ram, types)
