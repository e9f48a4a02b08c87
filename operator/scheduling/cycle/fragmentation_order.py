"""The node walk of the ``fragmentation`` node policy: nodes tried in the order of how
little the pod's placement would raise their fragmentation (``fragmentation``).

Both dialects walk nodes this way when the pod's node policy (its annotation, else the
ConfigMap's) is ``fragmentation``: each dialect's node order (``annotation_plugin``,
``claims_plugin``) for the one walk (``walk``). The measure only orders: each node is
still gated and fitted in full in that order, and the first that fits wins, so every
rule of the other policies (node gate, quota, NUMA, type, topology) holds unchanged.
Nodes the estimate finds no room on are tried last, in the ranking's order.

Cost: each node's rise is cached per node state (its ``Summary``, replaced whenever its
cards change, and its CPU and memory in use), per pod shape and per mix version, so a
decision computes it only for the nodes changed since a pod of that shape was last
placed; the rest is one dictionary look-up and one sort per candidate.
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Final

from vgpu_operator import config as config_words
from vgpu_operator.scheduling.books import changes
from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_best_fit, claims
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.policies import fragmentation

FRAGMENTATION: Final = config_words.FRAGMENTATION

#: Pods remembered as already counted in the mix (a pod retried is counted once).
_SEEN_MAX: Final = 8192
#: Per node, the request sets whose cards after the pod are kept at most.
_SHAPES_MAX: Final = 32
#: Per node, the pod shapes (requests, CPU, memory) whose rise is kept at most (a trace
#: of 8,000 pods has about 150 shapes; 98 % of its pods are of the 96 most frequent).
_RISES_MAX: Final = 256
#: Pod shapes indexed at most; past it the one used least recently goes.
_INDEXES_MAX: Final = 128

Ranked = tuple[float, int, str]
#: A pod's shape as the rises are kept: its requests, CPU, memory and card types.
_ShapeKey = tuple[tuple[fragmentation.Need, ...], float, float, fragmentation.Types]
_UNKNOWN: Final = object()


class _Measured:
    """A node's cards as last measured: their states (sorted), the measure before any pod,
    after each pod shape asked (None: too few cards for it), and its free CPU and memory
    (for the ``used`` it was read from)."""

    __slots__ = ("after", "before", "before_value", "free", "rises", "states", "summary", "used")

    def __init__(
        self,
        summary: object,
        states: tuple[fragmentation.CardState, ...],
        before: fragmentation.Vector,
    ) -> None:
        self.summary = summary
        self.states = states
        self.before = before
        self.after: dict[tuple[tuple[fragmentation.Need, ...], fragmentation.Types], object] = {}
        self.used: object = None
        self.free: tuple[float, float] = (0.0, 0.0)
        #: For ``free``: the measure before any pod, and the rise per pod shape (requests,
        #: CPU, memory; None: no room seen), both dropped when the node's use changes.
        self.before_value: float | None = None
        self.rises: dict[_ShapeKey, float | None] = {}


#: Rises are compared to this many decimals: nodes whose rises differ by float noise only
#: are ties, which go to the fuller node (binpack's order), then the earlier one.
_DIGITS: Final = 6


def rank_key(rise: float, node: NodeEntry) -> tuple[float, float]:
    """A node's place under the policy (lower first): its rise, then binpack's."""
    return (round(rise, _DIGITS), -node.score)


class _ShapeIndex:
    """One pod shape's nodes by rise (rise, minus score, order, name), as of ``seq``."""

    __slots__ = ("entries", "seq", "sorted")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.sorted: list[tuple[float, float, str]] = []
        self.entries: dict[str, tuple[float, float, str]] = {}

    def put(self, name: str, rise: tuple[float, float] | None) -> None:
        old = self.entries.pop(name, None)
        if old is not None:
            at = bisect.bisect_left(self.sorted, old)
            if at < len(self.sorted) and self.sorted[at] == old:
                del self.sorted[at]
        if rise is not None:
            entry = (rise[0], rise[1], name)
            self.entries[name] = entry
            bisect.insort(self.sorted, entry)


class Placer:
    """The mix of requests seen and the per-node rises cached for it."""

    def __init__(
        self, mix: fragmentation.WorkloadMix | None = None, *, indexed: bool = False
    ) -> None:
        self.mix = mix or fragmentation.WorkloadMix()
        #: Whether the books' change log tells every change of the nodes walked (the live
        #: books: yes; a what-if's overlay changes copies the log does not see).
        self.indexed = indexed
        self._indexes: OrderedDict[_ShapeKey, _ShapeIndex] = OrderedDict()
        self._seen: OrderedDict[PodKey, None] = OrderedDict()
        #: Per node, its cards measured (while its summary and the mix's version hold).
        self._cache: dict[str, _Measured] = {}
        #: The cluster's cards per vendor, type and how many of them their node holds
        #: (the census the mix weighs classes by), from each node's cards as last
        #: measured; taken by the mix at a decision's start when it changed, so that no
        #: decision mixes two censuses.
        self._signatures: dict[str, tuple[fragmentation.CensusKey, ...]] = {}
        self._census: Counter[fragmentation.CensusKey] = Counter()
        self._census_changed = False
        self._measure = fragmentation.Measure(self.mix.weighted)
        self._measure_version = self.mix.version

    # --- the mix --------------------------------------------------------------------------
    def observe(self, key: PodKey, job: placement.Job) -> None:
        """Count the pod's request in the mix, once per pod (a decision's start)."""
        self._take_census()
        self._count(key, fragmentation.klass_of(job.needs, *_cpu_ram(job), _types(job)))

    def _take_census(self) -> None:
        if self._census_changed:
            self._census_changed = False
            self.mix.take_census(+self._census)

    def _sign(self, name: str, states: tuple[fragmentation.CardState, ...]) -> None:
        """Count the node's cards in the census (again only when its cards' vendors or
        types changed: a node's use does not move it)."""
        alike = Counter((state[0], state[7]) for state in states)
        signature = tuple((state[0], state[7], alike[state[0], state[7]]) for state in states)
        old = self._signatures.get(name)
        if old == signature:
            return
        if old is not None:
            self._census.subtract(old)
        self._census.update(signature)
        self._signatures[name] = signature
        self._census_changed = True

    def _count(self, key: PodKey, klass: fragmentation.Klass | None) -> None:
        if klass is None or key in self._seen:
            return
        self._seen[key] = None
        if len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)
        self.mix.observe(klass)

    def with_mix(self, job: placement.Job) -> placement.Job:
        """The job carrying this mix, so that Fit orders cards by it under the GPU policy
        ``fragmentation`` (a job without one orders by the prior)."""
        if job.mix is self.mix:
            return job
        return replace(job, mix=self.mix)

    # --- the node walk ----------------------------------------------------------------------
    @staticmethod
    def walks_nodes(job: placement.Job, default_policy: str) -> bool:
        """Whether the pod's nodes are walked by fragmentation: its own node policy, else
        the ConfigMap's (a node's own annotation ranks it among the others as binpack)."""
        policy = job.pod_node_policy
        if policy is None:
            policy = default_policy
        return policy == FRAGMENTATION

    def order(
        self,
        job: placement.Job,
        walk: Iterable[Ranked],
        nodes: Mapping[str, NodeEntry],
        log: changes.ChangeLog | None = None,
    ) -> Iterable[Ranked]:
        """``walk`` reordered: least rise first (ties: the ranking's order), then the
        nodes the estimate finds no room on, in the ranking's order. With the books'
        change ``log`` (the live books' full walk), the order comes from an index kept
        per pod shape and brought up to date with the nodes changed since."""
        if log is not None and self.indexed:
            return self._indexed(job, walk, nodes, log)
        scored: list[tuple[float, int, Ranked]] = []
        rest: list[Ranked] = []
        needs = job.needs
        cpu, ram = _cpu_ram(job)
        types = _types(job)
        for position, entry in enumerate(walk):
            node = nodes[entry[2]]
            # A node the summary rules out is passed over by the walk anyway: not measured.
            fits = node.summary.may_fit(job)
            rise = self.rise_of(node, needs, cpu, ram, types) if fits else None
            if rise is None:
                rest.append(entry)
            else:
                scored.append((round(rise, _DIGITS), position, entry))
        scored.sort(key=lambda item: (item[0], item[1]))
        return [entry for _rise, _position, entry in scored] + rest

    def _indexed(
        self,
        job: placement.Job,
        walk: Iterable[Ranked],
        nodes: Mapping[str, NodeEntry],
        log: changes.ChangeLog,
    ) -> Iterator[Ranked]:
        cpu, ram = _cpu_ram(job)
        types = _types(job)
        key = (job.needs, cpu, ram, types)
        self._measured_all()  # a new mix version drops every index
        index = self._indexes.get(key)
        changed = None if index is None else log.since(index.seq)
        if index is None or changed is None:
            if len(self._indexes) >= _INDEXES_MAX:
                self._indexes.popitem(last=False)
            index = self._indexes[key] = _ShapeIndex(log.seq)
            changed = set(nodes)
        self._indexes.move_to_end(key)
        index.seq = log.seq
        for name in changed:
            node = nodes.get(name)
            if node is None:
                self.forget(name)
            rise = None if node is None else self.rise_of(node, job.needs, cpu, ram, types)
            index.put(name, None if rise is None or node is None else rank_key(rise, node))
        listed: set[str] = set()
        for rise, _score, name in list(index.sorted):
            listed.add(name)
            yield (rise, 0, name)
        for entry in walk:
            if entry[2] not in listed:
                yield entry

    def order_claims(
        self,
        key: PodKey,
        job: placement.Job,
        nodes: Sequence[NodeEntry],
        requests: Sequence[claims.Request],
    ) -> list[NodeEntry]:
        """The DRA path's candidates in this order, the claims' requests read as needs of
        any card (``claim_best_fit.Want``: a request naming no memory takes the whole
        card's, as the agent's default request policy gives it); counted in the mix."""
        needs = tuple(_claim_need(claim_best_fit.Want.of(r)) for r in requests)
        cpu, ram = _cpu_ram(job)
        self._take_census()
        self._count(key, fragmentation.klass_of(needs, cpu, ram))
        scored: list[tuple[float, int, NodeEntry]] = []
        rest: list[NodeEntry] = []
        for position, node in enumerate(nodes):
            rise = self.rise_of(node, needs, cpu, ram)
            if rise is None:
                rest.append(node)
            else:
                scored.append((round(rise, _DIGITS), position, node))
        scored.sort(key=lambda item: (item[0], item[1]))
        return [node for _rise, _position, node in scored] + rest

    def rise(self, node: NodeEntry, job: placement.Job) -> float | None:
        """How much the pod would raise the node's fragmentation (None: no room seen)."""
        return self.rise_of(node, job.needs, *_cpu_ram(job), _types(job))

    def rise_of(
        self,
        node: NodeEntry,
        needs: tuple[fragmentation.Need, ...],
        cpu: float,
        ram: float,
        types: fragmentation.Types = (),
    ) -> float | None:
        """The rise of a pod of these requests, CPU, memory and card types on the node."""
        measured = self._measured(node)
        free_cpu, free_ram = measured.free
        if cpu > free_cpu or ram > free_ram:
            return None
        key = (needs, cpu, ram, types)
        if key in measured.rises:
            return measured.rises[key]
        after = measured.after.get((needs, types), _UNKNOWN)
        if after is _UNKNOWN:
            if len(measured.after) >= _SHAPES_MAX:
                measured.after.clear()
            placed = self._measure.after(measured.states, needs, types)
            after = None if placed is None else self._measure.vector(placed)
            measured.after[needs, types] = after
        rise: float | None = None
        if isinstance(after, fragmentation.Vector):
            if measured.before_value is None:
                measured.before_value = measured.before.expected(free_cpu, free_ram)
            rise = after.expected(free_cpu - cpu, free_ram - ram) - measured.before_value
        if len(measured.rises) >= _RISES_MAX:
            measured.rises.clear()
        measured.rises[key] = rise
        return rise

    def _measured_all(self) -> None:
        """Start afresh when the mix has a new version."""
        if self._measure_version != self.mix.version:
            self._measure = fragmentation.Measure(self.mix.weighted)
            self._measure_version = self.mix.version
            self._cache.clear()
            self._indexes.clear()

    def _measured(self, node: NodeEntry) -> _Measured:
        """The node's cards measured, again only when they or the mix changed."""
        self._measured_all()
        measured = self._cache.get(node.name)
        if measured is None or measured.summary is not node.summary:
            states = tuple(sorted(fragmentation.state_of(c) for c in node.cards))
            measured = _Measured(node.summary, states, self._measure.vector(states))
            self._cache[node.name] = measured
            self._sign(node.name, states)
        if measured.used is not node.used:
            measured.used = node.used
            measured.free = _free_cpu_ram(node)
            measured.before_value = None
            measured.rises.clear()
        return measured

    def forget(self, name: str) -> None:
        """The node is gone: its measures and its cards in the census."""
        self._cache.pop(name, None)
        old = self._signatures.pop(name, None)
        if old is not None:
            self._census.subtract(old)
            self._census_changed = True


def _claim_need(want: claim_best_fit.Want) -> fragmentation.Need:
    if want.memory_mib is None:
        return ("", want.count, 0, 100, want.cores or 0)
    return ("", want.count, want.memory_mib, -1, want.cores or 0)


def _types(job: placement.Job) -> fragmentation.Types:
    """The card types the pod accepts (its ``use-gputype``, per vendor; empty: any)."""
    types: list[str] = []
    for card_filter in job.card_filters.values():
        types.extend(card_filter.use_types)
    return tuple(sorted(set(types)))


def _cpu_ram(job: placement.Job) -> tuple[float, float]:
    return float(job.resources.cpu), float(job.resources.memory)


def _free_cpu_ram(node: NodeEntry) -> tuple[float, float]:
    facts = node.facts
    cpu = float("inf") if facts.allocatable_cpu is None else float(facts.allocatable_cpu)
    ram = float("inf") if facts.allocatable_memory is None else float(facts.allocatable_memory)
    return cpu - float(node.used.cpu), ram - float(node.used.memory)
