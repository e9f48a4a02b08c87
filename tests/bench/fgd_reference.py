"""Reference scorers for the FGD replay: FGD, best fit and GPU packing as FGD's paper
and its published runs define them, on a cluster model of their own (bench only).

Written from "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (Weng et al., USENIX ATC '23, §3-§5) and from the
semantics of the simulator behind its figures; nothing here is product code, and no
user picks these policies: they exist so that the replay compares ``fragmentation``
with FGD itself rather than with a number from a paper.

The model (``Node``) is what FGD's scheduler sees: per node its CPU (milli) and memory
(MiB) left, the GPU milli left on each card in device order, and the card model. A
request (``Shape``) is CPU milli, GPU milli per card (0: none), a card count and the
card models it accepts.

FGD's measure (§4): for one request, a node's idle GPU milli that request cannot use,
that is all of it when the request cannot run on the node at all (its CPU, its card
model, or too few cards with room for its per-card share), else the idle milli of each
card with less room than the share. A CPU-only request counts all the node's idle GPU
milli (it cannot use any). GPU only: memory is not in the measure (the scheduler's
filter still checks it). The node's fragmentation is that amount weighted by the
target mix (``target_mix``: the request shapes of the task list itself, most frequent
first, up to 95 % of the tasks, renormalised).

FGD's choice: each node that fits is scored by the fall of its fragmentation (before
minus after the pod, the pod's cards as the card rule picks them), as
``int(100 * sigmoid(fall / 1000))`` (a kube-scheduler score of 0-100: falls within a few
hundredths of a GPU of each other tie); the highest score wins, ties going to the
lexicographically first node name. Cards by the same rule: a share goes to the card
whose choice scores highest (ties: the lowest index); whole cards are the lowest-index
free ones. Best fit and GPU packing are FGD's two strongest baselines (§6), scored and
tied the same way.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

MILLI: Final = 1000
#: Best fit's normalisation (the largest node's CPU milli and GPU milli, as FGD's runs).
MAX_CPU: Final = 128_000
MAX_GPU: Final = 8_000
#: The share of tasks whose shapes make FGD's target mix.
POPULARITY: Final = 0.95


@dataclass(frozen=True, slots=True)
class Shape:
    """One request as the scorers read it (no memory: FGD's measure has none)."""

    cpu: int
    milli: int
    count: int
    #: Card models accepted (empty: any).
    models: frozenset[str] = frozenset()

    @property
    def gpu_total(self) -> int:
        return self.milli * self.count

    def accepts(self, model: str) -> bool:
        return not self.models or model in self.models

    @property
    def order(self) -> tuple[int, int, int, str]:
        """FGD's order of shapes of one frequency (CPU, share, count, models)."""
        return (self.cpu, self.milli, self.count, "|".join(sorted(self.models)))


#: A target mix: (weight, shape), weights summing to 1.
Mix = tuple[tuple[float, Shape], ...]


def target_mix(shapes: Iterable[Shape], popularity: float = POPULARITY) -> Mix:
    """The most frequent shapes of the task list, up to ``popularity`` of the tasks (the
    last shape that crosses it included), weights renormalised to 1; shapes of equal
    frequency are taken largest first (CPU, then share, count, models)."""
    counts = Counter(shapes)
    total = sum(counts.values())
    if total == 0:
        return ()
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].order), reverse=True)
    kept: list[tuple[int, Shape]] = []
    covered = 0
    for shape, count in ranked:
        if covered >= popularity * total:
            break
        kept.append((count, shape))
        covered += count
    return tuple((count / covered, shape) for count, shape in kept)


class Node:
    """One node as FGD's scheduler sees it; ``version`` moves on every change."""

    __slots__ = ("cards", "cpu_left", "mem_left", "model", "name", "version")

    def __init__(self, name: str, model: str, cpu: int, mem: int, cards: int) -> None:
        self.name = name
        self.model = model
        self.cpu_left = cpu
        self.mem_left = mem
        self.cards = [MILLI] * cards
        self.version = 0

    @property
    def idle(self) -> int:
        return sum(self.cards)

    def able(self, milli: int) -> int:
        return sum(1 for left in self.cards if left >= milli)

    def fits(self, shape: Shape, mem: int) -> bool:
        """FGD's filter: CPU and memory of the node, then card model and room."""
        if shape.cpu > self.cpu_left or mem > self.mem_left:
            return False
        if shape.count == 0:
            return True
        return shape.accepts(self.model) and self.able(shape.milli) >= shape.count

    def place(self, shape: Shape, mem: int, cards: Sequence[int]) -> None:
        """Book the pod on these cards; ValueError when they cannot take it (a harness
        that mirrors another scheduler's decision must never see that)."""
        if len(cards) != shape.count or len(set(cards)) != len(cards):
            raise ValueError(f"{self.name}: {shape} on cards {list(cards)}")
        if shape.cpu > self.cpu_left or mem > self.mem_left:
            raise ValueError(f"{self.name}: no CPU or memory left for {shape}")
        if shape.count and not shape.accepts(self.model):
            raise ValueError(f"{self.name}: model {self.model} not accepted by {shape}")
        for card in cards:
            if self.cards[card] < shape.milli:
                raise ValueError(f"{self.name}: card {card} has {self.cards[card]} milli")
        for card in cards:
            self.cards[card] -= shape.milli
        self.cpu_left -= shape.cpu
        self.mem_left -= mem
        self.version += 1

    def release(self, shape: Shape, mem: int, cards: Sequence[int]) -> None:
        for card in cards:
            self.cards[card] += shape.milli
        self.cpu_left += shape.cpu
        self.mem_left += mem
        self.version += 1


class Measure:
    """FGD's node fragmentation against one target mix, in GPU milli.

    Per card state (model and sorted milli left), what each class strands with CPU to
    spare is computed once; the classes sorted by CPU then give the node's measure for
    any CPU left with one bisection: F = idle - sum over the classes whose CPU fits of
    weight * (idle - stranded).
    """

    def __init__(self, mix: Mix) -> None:
        ordered = sorted(mix, key=lambda ws: ws[1].cpu)
        self.mix = mix
        self._weights = [w for w, _s in ordered]
        self._shapes = [s for _w, s in ordered]
        self._cpus = [s.cpu for s in self._shapes]
        self._memo: dict[tuple[str, tuple[int, ...]], tuple[int, list[float]]] = {}

    def node(self, node: Node) -> float:
        return self.of(node.model, node.cpu_left, node.cards)

    def of(self, model: str, cpu_left: int, cards: Sequence[int]) -> float:
        key = (model, tuple(sorted(cards)))
        entry = self._memo.get(key)
        if entry is None:
            if len(self._memo) > 500_000:
                self._memo.clear()
            entry = self._memo[key] = self._prefix(model, key[1])
        idle, prefix = entry
        return idle - prefix[bisect.bisect_right(self._cpus, cpu_left)]

    def _prefix(self, model: str, cards: tuple[int, ...]) -> tuple[int, list[float]]:
        idle = sum(cards)
        prefix = [0.0]
        running = 0.0
        for weight, shape in zip(self._weights, self._shapes, strict=True):
            running += weight * (idle - self.stranded(shape, model, cards, idle))
            prefix.append(running)
        return idle, prefix

    @staticmethod
    def stranded(shape: Shape, model: str, cards: Sequence[int], idle: int) -> int:
        """The idle milli ``shape`` cannot use, CPU aside (it fits the node's CPU)."""
        if shape.count == 0 or not shape.accepts(model):
            return idle
        if sum(1 for left in cards if left >= shape.milli) < shape.count:
            return idle
        return sum(left for left in cards if left < shape.milli)


class CpuMeasure(Measure):
    """FGD's measure with the node's CPU counted in proportion, not only as a threshold
    (an experiment of the replay, not FGD): a class can use at most as many GPUs as the
    pods of it the CPU left can run, ``cpu_left // cpu`` of them, so a node whose CPU
    runs out before its cards strands the rest for that class."""

    def __init__(self, mix: Mix) -> None:
        super().__init__(mix)
        self._usable: dict[tuple[str, tuple[int, ...]], tuple[int, list[int]]] = {}

    def of(self, model: str, cpu_left: int, cards: Sequence[int]) -> float:
        key = (model, tuple(sorted(cards)))
        entry = self._usable.get(key)
        if entry is None:
            if len(self._usable) > 500_000:
                self._usable.clear()
            idle = sum(key[1])
            usable = [idle - self.stranded(s, model, key[1], idle) for s in self._shapes]
            entry = self._usable[key] = (idle, usable)
        idle, usable = entry
        total = 0.0
        for weight, shape, can in zip(self._weights, self._shapes, usable, strict=True):
            if shape.cpu > 0 and can > 0:
                can = min(can, (cpu_left // shape.cpu) * shape.gpu_total)
            total += weight * (idle - can)
        return total


def sigmoid_score(fall: float) -> int:
    """kube-scheduler's 0-100 score of a fall in fragmentation (milli), as FGD's runs."""
    x = fall / MILLI
    if x >= 0:
        value = 1.0 / (1.0 + math.exp(-x))
    else:
        e = math.exp(x)
        value = e / (1.0 + e)
    return int(value * 100)


def exclusive_cards(node: Node, count: int) -> list[int]:
    """Whole cards: the lowest-index free ones."""
    return [i for i, left in enumerate(node.cards) if left == MILLI][:count]


def tightest_card(node: Node, milli: int) -> int:
    """Best fit's card for a share: the least room that fits (lowest index on ties)."""
    best = -1
    for i, left in enumerate(node.cards):
        if left >= milli and (best < 0 or left < node.cards[best]):
            best = i
    return best


def _packed(cards: Sequence[int], shape: Shape) -> list[int]:
    """The cards after ``shape`` taken from the least room that fits (FGD's measure of
    the node after a whole-card or CPU-only pod)."""
    out = list(cards)
    want = shape.count
    for i in sorted(range(len(out)), key=lambda i: out[i]):
        if want == 0:
            break
        if out[i] >= shape.milli:
            out[i] -= shape.milli
            want -= 1
    return out


class Fgd:
    """FGD's scorer, its scores cached per node version and shape."""

    def __init__(self, measure: Measure, quantise: bool = True) -> None:
        self.measure = measure
        self.quantise = quantise
        self._cache: dict[str, tuple[int, dict[Shape, tuple[float, list[int]]]]] = {}

    def score(self, node: Node, shape: Shape) -> tuple[float, list[int]]:
        kept = self._cache.get(node.name)
        if kept is None or kept[0] != node.version:
            kept = self._cache[node.name] = (node.version, {})
        hit = kept[1].get(shape)
        if hit is None:
            hit = kept[1][shape] = self._score(node, shape)
        return hit

    def _value(self, fall: float) -> float:
        return float(sigmoid_score(fall)) if self.quantise else fall

    def _score(self, node: Node, shape: Shape) -> tuple[float, list[int]]:
        before = self.measure.node(node)
        cpu_after = node.cpu_left - shape.cpu
        if shape.count == 1 and shape.milli < MILLI:
            per_value: dict[int, float] = {}
            best, card = -math.inf, -1
            for i, left in enumerate(node.cards):
                if left < shape.milli:
                    continue
                value = per_value.get(left)
                if value is None:
                    after_cards = list(node.cards)
                    after_cards[i] -= shape.milli
                    after = self.measure.of(node.model, cpu_after, after_cards)
                    value = per_value[left] = self._value(before - after)
                if value > best:
                    best, card = value, i
            return best, [card]
        after = self.measure.of(node.model, cpu_after, _packed(node.cards, shape))
        return self._value(before - after), exclusive_cards(node, shape.count)


def best_fit_raw(node: Node, shape: Shape) -> int:
    left = 0.5 * (node.cpu_left - shape.cpu) / MAX_CPU
    left += 0.5 * (node.idle - shape.gpu_total) / MAX_GPU
    return int((1.0 - left) * 100)


def cards_best_fit(node: Node, shape: Shape) -> list[int]:
    if shape.count == 0:
        return []
    if shape.milli < MILLI:
        return [tightest_card(node, shape.milli)]
    return exclusive_cards(node, shape.count)


def packing_score(node: Node, shape: Shape) -> int:
    """GPU packing (FGD §6): shares onto used cards first, then free cards of used nodes,
    then free nodes (fewest cards first)."""
    if shape.count == 0:
        return 0
    free = sum(1 for left in node.cards if left == MILLI)
    if free == len(node.cards):
        return max(100 // 3 - free, free)
    want, free_used, used = shape.count, 0, []
    for i in sorted(range(len(node.cards)), key=lambda i: node.cards[i]):
        if want == 0:
            break
        if node.cards[i] >= shape.milli:
            want -= 1
            used.append(i)
            free_used += node.cards[i] == MILLI
    if free_used:
        return max(100 // 2 - free_used, 100 // 3)
    room = sum(node.cards[i] * 100 // MILLI for i in used)
    return max(100 - room // 10, 100 // 2)


def normalised(scores: Sequence[int]) -> list[int]:
    """kube-scheduler's NormalizeScore as FGD's best fit uses it (integer 0-100)."""
    high, low = max(scores), min(scores)
    if high == low:
        return [0] * len(scores)
    return [(s - low) * 100 // (high - low) for s in scores]


POLICIES: Final = ("fgd", "bestfit", "packing", "fgd-cpu")


class Reference:
    """One reference policy deciding on the model: the node and its cards, or None when
    no node fits. Ties go to the node first in ``nodes``' order: FGD's runs break them
    by node name, and its simulator names each node with a random prefix (a permutation
    drawn from the run's seed), so the harness passes the nodes in a random order of
    the seed's, not in the trace's (which lists the nodes model by model)."""

    def __init__(self, policy: str, nodes: Sequence[Node], mix: Mix, quantise: bool = True):
        if policy not in POLICIES:
            raise ValueError(f"reference policy {policy!r}: choose one of {POLICIES}")
        self.policy = policy
        self.nodes = list(nodes)
        measure = CpuMeasure(mix) if policy == "fgd-cpu" else Measure(mix)
        self.fgd = Fgd(measure, quantise)

    def decide(self, shape: Shape, mem: int) -> tuple[Node, list[int]] | None:
        fitting = [n for n in self.nodes if n.fits(shape, mem)]
        if not fitting:
            return None
        if self.policy.startswith("fgd"):
            best_node, best_cards, best = fitting[0], [0], -math.inf
            for node in fitting:
                value, cards = self.fgd.score(node, shape)
                if value > best:
                    best_node, best_cards, best = node, cards, value
            return best_node, best_cards
        if self.policy == "bestfit":
            scores = normalised([best_fit_raw(n, shape) for n in fitting])
        else:
            scores = [packing_score(n, shape) for n in fitting]
        top = max(scores)
        chosen = fitting[scores.index(top)]
        return chosen, cards_best_fit(chosen, shape)


def cluster_fragmentation(measure: Measure, nodes: Iterable[Node]) -> tuple[float, int]:
    """FGD's cluster figures: fragmented GPU milli and idle GPU milli."""
    frag = 0.0
    idle = 0
    for node in nodes:
        frag += measure.node(node)
        idle += node.idle
    return frag, idle
