"""The autoscaler's series, among the operator's own (they exist, at 0, whether or not
``--autoscale-instance-types`` is given; docs/autoscaling.md lists them).

- ``vgpu_operator_autoscale_rounds_total{result}``: rounds, by what they did (``planned``:
  a search ran; ``idle``: nothing waited and nothing was on its way);
- ``vgpu_operator_autoscale_search_cpu_seconds``: the CPU time of each plan's search;
- ``vgpu_operator_autoscale_planned_nodes{instance_type}``: the NodeClaims asked for and
  still on their way (not yet a node in the books with its inventory);
- ``vgpu_operator_autoscale_planned_price_per_hour``: their offerings' price, summed;
- ``vgpu_operator_autoscale_unplaceable_pods``: pods of the last plan no new node would hold;
- ``vgpu_operator_autoscale_claims_total{event}``: NodeClaims created, withdrawn (failed,
  late or gone), deleted as no pod needed them any more, and given back (scale-down).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "vgpu_operator_autoscale"
#: A search is bounded by ``max_search_s`` (seconds of CPU): buckets up to a minute.
_SEARCH_BUCKETS = (0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ClaimEvent(enum.StrEnum):
    CREATED = "created"
    WITHDRAWN = "withdrawn"
    UNNEEDED = "unneeded"
    GIVEN_BACK = "given_back"


class AutoscaleMetrics:
    """See the module docstring."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._rounds = Counter(
            f"{PREFIX}_rounds",
            "Autoscaler rounds, by what they did.",
            ["result"],
            registry=registry,
        )
        self._search = Histogram(
            f"{PREFIX}_search_cpu_seconds",
            "CPU time of each plan's search for the fewest, then cheapest, new nodes.",
            buckets=_SEARCH_BUCKETS,
            registry=registry,
        )
        self._planned = Gauge(
            f"{PREFIX}_planned_nodes",
            "NodeClaims asked for and still on their way, by instance type.",
            ["instance_type"],
            registry=registry,
        )
        self._price = Gauge(
            f"{PREFIX}_planned_price_per_hour",
            "The summed offering price of the NodeClaims on their way.",
            registry=registry,
        )
        self._unplaceable = Gauge(
            f"{PREFIX}_unplaceable_pods",
            "Pods of the last plan that no new node would hold.",
            registry=registry,
        )
        self._claims = Counter(
            f"{PREFIX}_claims",
            "NodeClaims of the operator, by event.",
            ["event"],
            registry=registry,
        )
        for result in ("planned", "idle"):
            self._rounds.labels(result=result)
        for event in ClaimEvent:
            self._claims.labels(event=event.value)
        self._types: set[str] = set()

    def round_idle(self) -> None:
        self._rounds.labels(result="idle").inc()

    def planned(self, search_cpu_s: float, unplaceable_pods: int) -> None:
        self._rounds.labels(result="planned").inc()
        self._search.observe(max(0.0, search_cpu_s))
        self._unplaceable.set(unplaceable_pods)

    def in_flight(self, nodes: Iterable[tuple[str, float]]) -> None:
        """The claims on their way now: (instance type, price) each."""
        counts: dict[str, int] = dict.fromkeys(self._types, 0)
        price = 0.0
        for kind, each in nodes:
            counts[kind] = counts.get(kind, 0) + 1
            price += each
        for kind, count in counts.items():
            self._planned.labels(instance_type=kind).set(count)
        self._types = set(counts)
        self._price.set(price)

    def claim(self, event: ClaimEvent) -> None:
        self._claims.labels(event=event.value).inc()
