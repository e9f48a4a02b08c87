"""The engine's figures at scrape time: per card, per namespace quota, the queue's census,
stranded memory and the fragmentation policy's learned mix.

They are not pushed: a collector reads them from the engine through callables handed in
by the operator, so they can never drift from the engine's books. The six per-card series
are the bulk of a scrape (48,000 lines at 8,000 cards, half a second through the generic
formatter, holding the GIL): ``DeviceText`` writes them directly, keeping each card's
label set between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, cast

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from vgpu_operator.metrics.labels import CORES_PER_CARD, MIB_BYTES, PREFIX, UNSCHEDULABLE_REASONS


class DeviceRow(Protocol):
    """What the collector reads per card (``scheduling.cycle.cluster.DeviceUsageRow``)."""

    @property
    def node(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def vendor(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def used_slots(self) -> int: ...
    @property
    def total_slots(self) -> int: ...
    @property
    def used_memory_mib(self) -> int: ...
    @property
    def total_memory_mib(self) -> int: ...
    @property
    def used_cores(self) -> int: ...
    @property
    def total_cores(self) -> int: ...


DeviceSource = Callable[[], Sequence[DeviceRow]]
#: namespace -> resource -> (used, limit), as ``ClusterState.quota_usage`` returns it.
QuotaSource = Callable[[], Mapping[str, Mapping[str, tuple[int, int]]]]
#: (pods per queue name, parked pods per reason code), as the scheduling queue counts them.
WaitingSource = Callable[[], tuple[Mapping[str, int], Mapping[str, int]]]
#: node -> stranded card memory in MiB (``scheduling.policies.stranded``).
StrandedSource = Callable[[], Mapping[str, int]]
#: What the fragmentation policy has learned: per GPU shape's labels, its share.
LearnedSource = Callable[[], Mapping[tuple[str, str, str, str], float]]


@dataclass(frozen=True, slots=True)
class _DeviceFamily:
    name: str
    documentation: str
    value: Callable[[DeviceRow], float]


#: prometheus_client's own number formatting (untyped there), so both paths agree.
_number_text = cast(Callable[[float], str], floatToGoString)

_DEVICE_LABELS: Final = ("node", "device", "vendor", "type")
_DEVICE_FAMILIES: Final = (
    _DeviceFamily(
        f"{PREFIX}_device_memory_allocated_bytes",
        "Device memory booked by pods on this card.",
        lambda row: row.used_memory_mib * MIB_BYTES,
    ),
    # Capacities are gauges: no `_total` suffix, which means a counter.
    _DeviceFamily(
        f"{PREFIX}_device_memory_capacity_bytes",
        "Device memory this card registers (after memory scaling).",
        lambda row: row.total_memory_mib * MIB_BYTES,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_cores_allocated_ratio",
        "Compute booked on this card, in whole cards (1.0 = 100 cores).",
        lambda row: row.used_cores / CORES_PER_CARD,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_cores_capacity_ratio",
        "Compute this card registers, in whole cards (after core scaling).",
        lambda row: row.total_cores / CORES_PER_CARD,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_shares_allocated",
        "Pod containers sharing this card.",
        lambda row: row.used_slots,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_shares_capacity",
        "Pod containers this card may hold (deviceSplitCount).",
        lambda row: row.total_slots,
    ),
)


def _label_value(text: str) -> str:
    """A label value escaped for the text format (node names and models come from
    inventories, which anyone with write access could fill with quotes or newlines)."""
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class DeviceText:
    """The per-card series as exposition text, written directly.

    Produces what prometheus_client's own formatter writes for the same families (a
    unit test holds the two equal) at a fraction of its cost. Each card's escaped label
    set is kept between scrapes (cards come and go rarely; their figures change often),
    and a number's text is made once per scrape however many cards share it.
    """

    def __init__(self) -> None:
        self._labels: dict[tuple[str, str, str, str], str] = {}

    def render(self, rows: Iterable[DeviceRow]) -> str:
        kept = self._labels
        labels_now: dict[tuple[str, str, str, str], str] = {}
        numbers: dict[float, str] = {}
        columns: list[list[str]] = [[] for _ in _DEVICE_FAMILIES]
        for row in rows:
            key = (row.node, row.uuid, row.vendor, row.type)
            labels = kept.get(key) or labels_now.get(key) or _card_labels(row)
            labels_now[key] = labels
            for column, family in zip(columns, _DEVICE_FAMILIES, strict=True):
                value = family.value(row)
                text = numbers.get(value)
                if text is None:
                    text = numbers[value] = _number_text(value)
                column.append(f"{family.name}{labels} {text}\n")
        self._labels = labels_now
        parts: list[str] = []
        for family, column in zip(_DEVICE_FAMILIES, columns, strict=True):
            parts.append(_header(family.name, family.documentation, "gauge"))
            parts.extend(column)
        return "".join(parts)


def _card_labels(row: DeviceRow) -> str:
    # The text format lists labels sorted by name: device, node, type, vendor.
    return (
        f'{{device="{_label_value(row.uuid)}",node="{_label_value(row.node)}",'
        f'type="{_label_value(row.type)}",vendor="{_label_value(row.vendor)}"}}'
    )


def _header(name: str, documentation: str, kind: str) -> str:
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


QuotaTable = Mapping[str, Mapping[str, tuple[int, int]]]


def quota_families(table: QuotaTable) -> Iterator[Metric]:
    used = GaugeMetricFamily(
        f"{PREFIX}_quota_used",
        "Device resources booked in a namespace, in the quota's own units.",
        labels=["namespace", "resource"],
    )
    limit = GaugeMetricFamily(
        f"{PREFIX}_quota_limit",
        "The namespace's ResourceQuota limit for a device resource; no series where "
        "there is no limit, so `used > limit` alerts only where a limit exists.",
        labels=["namespace", "resource"],
    )
    for namespace, resources in sorted(table.items()):
        for resource, (used_value, limit_value) in sorted(resources.items()):
            used.add_metric([namespace, resource], used_value)
            if limit_value > 0:  # the engine's 0 means "no limit", not "nothing allowed"
                limit.add_metric([namespace, resource], limit_value)
    yield used
    yield limit


#: How long a scrape waits for the scheduling loop to copy the engine's figures.
ENGINE_COPY_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class WaitingFigures:
    """A copy of the queue's census, the stranded memory and what the fragmentation
    policy has learned, taken on the loop."""

    queues: Mapping[str, int]
    reasons: Mapping[str, int]
    stranded_mib: Mapping[str, int]
    learned: Mapping[tuple[str, str, str, str], float] = field(default_factory=dict)


NOTHING_WAITING: Final = WaitingFigures({}, {}, {})
#: The engine's figures as a scrape copies them: per-device rows, quota usage, waiting.
EngineFigures = tuple[list["DeviceRow"], "QuotaTable", WaitingFigures]


def waiting_families(waiting: WaitingFigures) -> Iterator[Metric]:
    pending = GaugeMetricFamily(
        f"{PREFIX}_pending_pods",
        "Pods waiting for this scheduler, by queue: active (due now), backoff (waiting "
        "for their backoff to end), unschedulable (did not fit; wait for a change).",
        labels=["queue"],
    )
    for queue, count in sorted(waiting.queues.items()):
        pending.add_metric([queue], count)
    unschedulable = GaugeMetricFamily(
        f"{PREFIX}_unschedulable_pods",
        "Unschedulable pods by the reason codes of their PodScheduled condition; a pod "
        "whose message names several reasons counts under each.",
        labels=["reason"],
    )
    known = dict.fromkeys(UNSCHEDULABLE_REASONS, 0)
    for reason, count in waiting.reasons.items():
        if reason in known:  # a closed set: nothing from outside becomes a label
            known[reason] = count
    for reason, count in known.items():
        unschedulable.add_metric([reason], count)
    stranded = GaugeMetricFamily(
        f"{PREFIX}_stranded_memory_bytes",
        "Free card memory on the node that no pending request could use (0 while no "
        "GPU pod is pending); defined in docs/operations.md.",
        labels=["node"],
    )
    for node, mib in sorted(waiting.stranded_mib.items()):
        stranded.add_metric([node], mib * MIB_BYTES)
    learned = GaugeMetricFamily(
        f"{PREFIX}_fragmentation_learned_share",
        "The share of recent requests of each GPU shape (vendor, cards, memory per card, "
        "cores per card), as the fragmentation policy weighs them (a prior of common "
        "sizes, fading as pods are seen); at most 48 shapes.",
        labels=["vendor", "cards", "memory", "cores"],
    )
    for labels, share in sorted(waiting.learned.items()):
        learned.add_metric(list(labels), share)
    yield pending
    yield unschedulable
    yield stranded
    yield learned


class StateCollector(Collector):
    """Reads the engine's books at scrape time (for ``render`` and sample lookups;
    the /metrics endpoint goes through ``OperatorMetrics.render_beside_the_loop``)."""

    def __init__(self) -> None:
        self.devices: DeviceSource | None = None
        self.quotas: QuotaSource | None = None
        self.waiting: WaitingSource | None = None
        self.stranded: StrandedSource | None = None
        self.learned: LearnedSource | None = None

    def read_waiting(self) -> WaitingFigures:
        """The census, stranded memory and learned mix, copied (call on the engine's
        thread)."""
        queues: Mapping[str, int] = {}
        reasons: Mapping[str, int] = {}
        if self.waiting is not None:
            queues, reasons = self.waiting()
        stranded = self.stranded() if self.stranded is not None else {}
        learned = self.learned() if self.learned is not None else {}
        if not (queues or reasons or stranded or learned):
            return NOTHING_WAITING
        return WaitingFigures(dict(queues), dict(reasons), dict(stranded), dict(learned))

    def describe(self) -> Iterable[Metric]:
        # Registering must not call the sources (the engine may not exist yet).
        return []

    def collect(self) -> Iterator[Metric]:
        families = [
            GaugeMetricFamily(f.name, f.documentation, labels=list(_DEVICE_LABELS))
            for f in _DEVICE_FAMILIES
        ]
        for row in self.devices() if self.devices is not None else []:
            values = [row.node, row.uuid, row.vendor, row.type]
            for family, spec in zip(families, _DEVICE_FAMILIES, strict=True):
                family.add_metric(values, spec.value(row))
        yield from families
        yield from quota_families(self.quotas() if self.quotas is not None else {})
        yield from waiting_families(self.read_waiting())


class Collected(Collector):
    """Metric families already collected (a registry's, or a copy), for formatting."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return self._collect()
